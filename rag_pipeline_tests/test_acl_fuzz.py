"""ACL leak fuzzing: random corpora with random label sets, random queries and callers; no search, in any
mode, ever returns a chunk whose labels do not intersect the caller's. Runs on the real database and model."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pgvector import HalfVector
from psycopg import sql

from rag_pipeline import store
from rag_pipeline.config import EmbeddingConfig
from rag_pipeline.embedding.embedders import get_embedder
from rag_pipeline.embedding.identity import configured_identity
from rag_pipeline.retrieval.search import SearchError, search

LABELS = ["staff", "finance", "hr", "legal", "board"]
WORDS = ["robot", "battery", "invoice", "salary", "contract", "travel", "policy", "merger", "badge", "audit"]

label_sets = st.sets(st.sampled_from(LABELS), min_size=1, max_size=3)
documents = st.lists(
    st.tuples(label_sets, st.lists(st.lists(st.sampled_from(WORDS), min_size=3, max_size=12), min_size=1,
                                   max_size=3)),
    min_size=1, max_size=12,
)


@pytest.fixture(scope="module")
def model_dims() -> int:
    return get_embedder("all-MiniLM-L6-v2").dimensions


def _load_corpus(db, version: store.versions.IndexVersion, corpus, seed: int) -> None:
    rng = np.random.default_rng(seed)
    table = sql.Identifier(version.table_name)
    with db.transaction():
        db.execute("DELETE FROM documents")
        for d, (labels, chunk_words) in enumerate(corpus):
            doc_id = f"doc{d}"
            db.execute(
                """INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at, acl_labels,
                                          status) VALUES (%s, 'fuzz', %s, 'f', 1, now(), %s, 'indexed')""",
                (doc_id, f"{doc_id}.md", sorted(labels)),
            )
            for ordinal, words in enumerate(chunk_words):
                chunk_id, text = f"{doc_id}-{ordinal}", " ".join(words)
                db.execute(
                    """INSERT INTO chunks (chunk_id, doc_id, ordinal, text, page_start, page_end, token_count,
                                           content_hash, chunker_version) VALUES (%s, %s, %s, %s, 1, 1, 5, 'h', 'c')""",
                    (chunk_id, doc_id, ordinal, text),
                )
                vector = rng.normal(size=version.dimensions)
                db.execute(
                    sql.SQL("""INSERT INTO {} (chunk_id, owner_chunk_id, doc_id, ordinal, text, prefix, section_path,
                                               page_start, page_end, content_type, acl_labels, embedding_input_sha,
                                               embedding)
                               VALUES (%s, %s, %s, %s, %s, '', '', 1, 1, 'prose', %s, 's', %s)""").format(table),
                    (chunk_id, chunk_id, doc_id, ordinal, text, sorted(labels),
                     HalfVector(vector / np.linalg.norm(vector))),
                )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    corpus=documents,
    seed=st.integers(0, 2**16),
    caller=st.sets(st.sampled_from(LABELS + ["nobody"]), max_size=3),
    query=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4).map(" ".join),
    mode=st.sampled_from(["hybrid", "dense", "sparse"]),
    k=st.integers(1, 10),
)
def test_no_search_returns_a_chunk_the_caller_may_not_read(db, model_dims, corpus, seed, caller, query, mode, k):
    model = configured_identity(EmbeddingConfig())
    with db.transaction():
        db.execute("""INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds)
                      VALUES ('fuzz', '/nonexistent', '{}', 3600) ON CONFLICT DO NOTHING""")
        version = store.versions.ensure_active(db, model, model_dims, "c", "p")
    _load_corpus(db, version, corpus, seed)
    if not caller:
        with pytest.raises(SearchError):
            search(db, query, sorted(caller), k=k, mode=mode)
        return
    hits = search(db, query, sorted(caller), k=k, mode=mode)
    visible = {f"doc{d}" for d, (labels, _) in enumerate(corpus) if labels & caller}
    for hit in hits:
        assert hit.doc_id in visible, (hit.doc_id, caller)
        row_labels = db.execute(sql.SQL("SELECT acl_labels FROM {} WHERE chunk_id = %s").format(
            sql.Identifier(version.table_name)), (hit.chunk_id,)).fetchone()[0]
        assert set(row_labels) & caller
    # Nothing readable is withheld in the dense list: k hits whenever k readable chunks exist.
    readable = sum(len(chunks) for labels, chunks in corpus if labels & caller)
    if mode == "dense":
        assert len(hits) == min(k, readable)
