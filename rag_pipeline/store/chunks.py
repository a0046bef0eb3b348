"""Chunks (version-independent text and structure), the LLM prefix cache and the embedding cache."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import psycopg
from pgvector import HalfVector

from rag_pipeline.store import groups
from rag_pipeline.text.chunking import Chunk


@dataclass(frozen=True)
class StoredChunk:
    chunk_id: str
    doc_id: str
    ordinal: int
    text: str
    prefix: str
    section_path: str
    page_start: int
    page_end: int
    content_type: str
    group_id: str | None = None
    text_config: str = "english"  # the text search configuration of the document's language (BM25)

    @property
    def embedding_input(self) -> str:
        # The prefix situates the chunk for the embedding and for BM25; the stored text stays pristine.
        return f"{self.prefix}\n{self.text}" if self.prefix else self.text


def replace_chunks(
    conn: psycopg.Connection,
    doc_id: str,
    chunks: Sequence[Chunk],
    prefixes: Sequence[str],
    flags: Sequence[Sequence[str]],
    chunker_version: str,
    parser_version: str | None,
    text_config: str,
) -> None:
    """A document's chunks, replaced (inside the caller's transaction, which holds the group-assignment lock). The
    near-duplicate groups its old chunks were in and that no chunk is left in are dropped here: the index write
    drops only the groups whose row the document owned, and another document's re-chunk can empty one later."""
    left = {row[0] for row in conn.execute("DELETE FROM chunks WHERE doc_id = %s RETURNING group_id", (doc_id,))
            if row[0]}
    with conn.cursor().copy(
        """COPY chunks (chunk_id, doc_id, ordinal, text, prefix, section_path, page_start, page_end,
                        content_type, token_count, content_hash, chunker_version, parser_version, flags,
                        text_config)
           FROM STDIN"""
    ) as copy:
        for chunk, prefix, chunk_flags in zip(chunks, prefixes, flags, strict=True):
            copy.write_row(
                (
                    chunk.chunk_id, doc_id, chunk.ordinal, chunk.text, prefix, chunk.section_path,
                    chunk.page_start, chunk.page_end, chunk.content_type, chunk.token_count,
                    chunk.content_hash, chunker_version, parser_version, list(chunk_flags), text_config,
                )
            )
    groups.drop_empty(conn, sorted(left))


def chunk_ids_of(conn: psycopg.Connection, doc_id: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT chunk_id FROM chunks WHERE doc_id = %s ORDER BY ordinal", (doc_id,)).fetchall()]


def chunks_of(conn: psycopg.Connection, doc_ids: Sequence[str]) -> dict[str, list[StoredChunk]]:
    result: dict[str, list[StoredChunk]] = {doc_id: [] for doc_id in doc_ids}
    rows = conn.execute(
        """SELECT chunk_id, doc_id, ordinal, text, prefix, section_path, page_start, page_end, content_type,
                  group_id, text_config::text
           FROM chunks WHERE doc_id = ANY(%s) ORDER BY doc_id, ordinal""",
        (list(doc_ids),),
    ).fetchall()
    for row in rows:
        result[row[1]].append(StoredChunk(*row))
    return result


def set_groups(conn: psycopg.Connection, assignments: Sequence[tuple[str, str]]) -> None:
    """Put chunks (chunk id, group id) in their near-duplicate groups, in one statement."""
    if assignments:
        conn.execute("""UPDATE chunks c SET group_id = a.group_id
                        FROM unnest(%s::text[], %s::text[]) AS a (chunk_id, group_id) WHERE c.chunk_id = a.chunk_id""",
                     ([chunk_id for chunk_id, _ in assignments], [group_id for _, group_id in assignments]))


# --- the LLM prefix cache --------------------------------------------------------------------------


def cached_prefixes(conn: psycopg.Connection, doc_id: str, doc_hash: str, prompt_version: str) -> dict[str, str]:
    """LLM prefixes already paid for this document content, by chunk hash; stale ones are dropped."""
    conn.execute(
        "DELETE FROM prefix_cache WHERE doc_id = %s AND (doc_content_hash <> %s OR prompt_version <> %s)",
        (doc_id, doc_hash, prompt_version),
    )
    return dict(
        conn.execute(
            "SELECT chunk_hash, prefix FROM prefix_cache WHERE doc_id = %s AND doc_content_hash = %s"
            " AND prompt_version = %s",
            (doc_id, doc_hash, prompt_version),
        ).fetchall()
    )


def store_prefixes(
    conn: psycopg.Connection, doc_id: str, doc_hash: str, prompt_version: str, prefixes: dict[str, str]
) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO prefix_cache (doc_id, doc_content_hash, chunk_hash, prompt_version, prefix)
               VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING""",
            [(doc_id, doc_hash, chunk_hash, prompt_version, text) for chunk_hash, text in prefixes.items()],
        )


# --- the embedding cache ---------------------------------------------------------------------------


def cached_embeddings(conn: psycopg.Connection, model: str, shas: Sequence[str]) -> dict[str, np.ndarray]:
    rows = conn.execute(
        "SELECT input_sha, embedding FROM embedding_cache WHERE model = %s AND input_sha = ANY(%s)",
        (model, list(shas)),
    ).fetchall()
    return {sha: np.asarray(vec.to_numpy(), dtype=np.float32) for sha, vec in rows}


# Namespace of the per-input advisory locks (the two-key form: never confused with the one-key locks elsewhere).
EMBEDDING_INPUT_LOCK_SPACE = 0x52414745


def lock_inputs(conn: psycopg.Connection, model: str, shas: Sequence[str]) -> None:
    """Lock each input to be embedded until the transaction ends, all in one call and one order (two transactions
    that lock this way and take no other lock meanwhile cannot deadlock). Keys are 32-bit hashes: two inputs that
    share one only make one run wait for the other, never skip work."""
    conn.execute(
        """SELECT pg_advisory_xact_lock(%s, k) FROM (
               SELECT DISTINCT hashtext(%s || ':' || sha) AS k FROM unnest(%s::text[]) AS sha ORDER BY k) AS keys""",
        (EMBEDDING_INPUT_LOCK_SPACE, model, list(shas)),
    ).fetchall()


def store_embeddings(conn: psycopg.Connection, model: str, vectors: dict[str, np.ndarray]) -> None:
    with conn.cursor() as cur:
        cur.executemany(
            """INSERT INTO embedding_cache (model, input_sha, embedding) VALUES (%s, %s, %s)
               ON CONFLICT (model, input_sha) DO NOTHING""",
            [(model, sha, HalfVector(vec)) for sha, vec in vectors.items()],
        )


def rekey_embedding_cache(conn: psycopg.Connection, old_model: str, new_model: str) -> int:
    """Move the cache rows of `old_model` to `new_model` (an entry the new key already has wins); returns how many
    rows the old key had."""
    conn.execute(
        """INSERT INTO embedding_cache (model, input_sha, embedding, created_at)
           SELECT %s, input_sha, embedding, created_at FROM embedding_cache WHERE model = %s
           ON CONFLICT (model, input_sha) DO NOTHING""",
        (new_model, old_model),
    )
    return conn.execute("DELETE FROM embedding_cache WHERE model = %s", (old_model,)).rowcount
