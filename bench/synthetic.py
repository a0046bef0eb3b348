"""A large index made quickly: real embeddings of a few thousand generated passages, each repeated with small
noise (so the vectors cluster like real ones do, unlike uniform random vectors), loaded with COPY into a
real index version table, with its HNSW index and its BM25 structures built after the load.

Two vocabularies for the text: `stress` (the 40 words of bench.common, each in almost every chunk: the worst
case for a lexical index) and `zipf` (tens of thousands of words with Zipfian frequencies, as in real text)."""

from __future__ import annotations

import itertools
import random
import time

import numpy as np
import psycopg
from pgvector import HalfVector
from psycopg import sql

from bench.common import WORDS, paragraph
from rag_pipeline import store
from rag_pipeline.config import EmbeddingConfig
from rag_pipeline.embedding.embedders import get_embedder
from rag_pipeline.embedding.identity import configured_identity

RARE_LABEL = "rare"  # on 2% of the documents: the selective ACL filter
TEAM_LABEL = "team"  # on 20% of them
COMMON_LABEL = "staff"  # on the rest


class ZipfText:
    """Text from a vocabulary of `size` made-up words whose frequencies follow Zipf's law (exponent 1.1)."""

    def __init__(self, size: int = 30_000, seed: int = 3):
        rng = random.Random(seed)
        consonants, vowels = "bcdfghjklmnprstvz", "aeiou"
        words: set[str] = set()
        while len(words) < size:
            words.add("".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(2, 5))))
        self.words = sorted(words)
        rng.shuffle(self.words)  # frequency rank unrelated to spelling
        self.cumulative = list(itertools.accumulate(1 / (rank + 1) ** 1.1 for rank in range(size)))

    def text(self, rng: random.Random, low: int = 40, high: int = 180) -> str:
        return " ".join(rng.choices(self.words, cum_weights=self.cumulative, k=rng.randint(low, high)))

    def query(self, rng: random.Random) -> str:
        """2-6 words: some as frequent as in the text, some drawn evenly from the 5,000 commonest."""
        count = rng.randint(2, 6)
        drawn = rng.choices(self.words, cum_weights=self.cumulative, k=count // 2)
        return " ".join(drawn + rng.sample(self.words[:5000], count - count // 2))


def synthetic_vectors(count: int, passages: int, seed: int = 3) -> tuple[list[str], np.ndarray]:
    """`count` (text, unit vector) pairs: `passages` embedded passages, each varied count/passages times."""
    rng = random.Random(seed)
    base_texts = [paragraph(rng, 20, 60) for _ in range(passages)]
    base = get_embedder("all-MiniLM-L6-v2").embed_documents(base_texts)
    noise = np.random.default_rng(seed)
    repeat = -(-count // passages)
    texts, vectors = [], []
    for copy in range(repeat):
        jitter = noise.normal(scale=0.02, size=base.shape).astype(np.float32)
        varied = base + jitter
        vectors.append(varied / np.linalg.norm(varied, axis=1, keepdims=True))
        texts += [f"{t} {' '.join(rng.choice(WORDS) for _ in range(5))} copy{copy}" for t in base_texts]
    return texts[:count], np.vstack(vectors)[:count]


def document_labels(d: int) -> list[str]:
    """The d-th document's label: one document in 50 is RARE_LABEL's, one in 5 TEAM_LABEL's (never the same)."""
    return [RARE_LABEL] if d % 50 == 0 else [TEAM_LABEL] if d % 5 == 1 else [COMMON_LABEL]


def load_index(conn: psycopg.Connection, texts: list[str], vectors: np.ndarray, chunks_per_document: int = 50,
               ) -> tuple[store.versions.IndexVersion, dict[str, float]]:
    """Documents, chunks and one active index version holding every row; returns it and load timings."""
    timings: dict[str, float] = {}
    documents = -(-len(texts) // chunks_per_document)
    with conn.transaction():
        conn.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds) "
                     "VALUES ('synthetic', '/nonexistent', '{}', 86400)")
        with conn.cursor().copy("COPY documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at, "
                                "acl_labels, status) FROM STDIN") as copy:
            for d in range(documents):
                copy.write_row((f"doc{d:06d}", "synthetic", f"doc{d:06d}.md", "f", 1, "2026-01-01", document_labels(d),
                                "indexed"))
        version = store.versions.ensure_active(conn, configured_identity(EmbeddingConfig()), vectors.shape[1], "synthetic",
                                               "synthetic")
    table = sql.Identifier(version.table_name)
    started = time.perf_counter()
    with conn.transaction():
        # A bulk load: triggers (BM25) off for the COPY, the structures rebuilt set-based afterwards.
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(f"{version.table_name}_hnsw")))
        with conn.cursor().copy(sql.SQL(
            "COPY {} (chunk_id, owner_chunk_id, doc_id, ordinal, text, prefix, section_path, page_start, page_end, "
            "content_type, acl_labels, embedding_input_sha, embedding) FROM STDIN").format(table)) as copy:
            for i, (text, vector) in enumerate(zip(texts, vectors, strict=True)):
                d = i // chunks_per_document
                copy.write_row((f"c{i:07d}", f"c{i:07d}", f"doc{d:06d}", i % chunks_per_document, text, "", "", 1, 1,
                                "prose", document_labels(d), f"s{i}", HalfVector(vector)))
    timings["copy_rows_s"] = time.perf_counter() - started
    started = time.perf_counter()
    conn.execute("SET maintenance_work_mem = '4GB'")  # the HNSW graph of 1,000,000 rows in memory while it is built
    conn.execute("SET work_mem = '256MB'")
    conn.execute(sql.SQL("CREATE INDEX {} ON {} USING hnsw (embedding halfvec_cosine_ops)").format(
        sql.Identifier(f"{version.table_name}_hnsw"), table))
    conn.execute(sql.SQL("ANALYZE {}").format(table))
    conn.commit()
    timings["build_hnsw_s"] = time.perf_counter() - started
    started = time.perf_counter()
    with conn.transaction():
        store.versions.rebuild_bm25(conn, version)
    conn.commit()
    # The steady state autovacuum reaches: visibility maps set, so the impact index is read index-only.
    conn.autocommit = True
    for part in ("", "_postings", "_bm25docs", "_bm25_df"):
        conn.execute(sql.SQL("VACUUM ANALYZE {}").format(sql.Identifier(f"{version.table_name}{part}")))
    conn.autocommit = False
    timings["build_bm25_s"] = time.perf_counter() - started
    return version, timings
