"""Documents as the CLI and Dagster report them: refs for paths and back, status counts, held documents."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg

from rag_pipeline.domain.status import DOCUMENT_HELD


def refs_of(conn: psycopg.Connection, paths: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """The refs of the documents at these (source, rel_path); paths that are no document are left out."""
    pairs = sorted(set(paths))
    if not pairs:
        return {}
    rows = conn.execute(
        """SELECT d.source, d.rel_path, d.ref FROM documents d
           JOIN unnest(%s::text[], %s::text[]) AS p (source, rel_path) USING (source, rel_path)""",
        ([s for s, _ in pairs], [r for _, r in pairs])).fetchall()
    return {(source, rel_path): ref for source, rel_path, ref in rows}


def refs_by_id(conn: psycopg.Connection, doc_ids: Iterable[str]) -> dict[str, int]:
    """The refs of the documents with these doc_ids; those that are no document are left out."""
    rows = conn.execute("SELECT doc_id, ref FROM documents WHERE doc_id = ANY(%s)", (sorted(set(doc_ids)),))
    return dict(rows.fetchall())


def paths_of(conn: psycopg.Connection, refs: Iterable[int]) -> dict[int, tuple[str, str]]:
    """(source, rel_path) of the documents with these refs (the CLI resolving what Dagster shows)."""
    rows = conn.execute("SELECT ref, source, rel_path FROM documents WHERE ref = ANY(%s)",
                        (sorted(set(refs)),)).fetchall()
    return {ref: (source, rel_path) for ref, source, rel_path in rows}


def identities_of(conn: psycopg.Connection, refs: Iterable[int]) -> dict[int, dict[str, Any]]:
    """What the documents with these refs are (rag.document_identity: title, organisation, kind, period, and where
    each was read)."""
    rows = conn.execute("SELECT ref, rag.document_identity(title, metadata, identity) FROM documents "
                        "WHERE ref = ANY(%s)", (sorted(set(refs)),)).fetchall()
    return dict(rows)


def status_counts(conn: psycopg.Connection) -> dict[str, int]:
    return dict(conn.execute("SELECT status, count(*) FROM documents GROUP BY status").fetchall())


def held_documents(conn: psycopg.Connection) -> list[tuple[str, str, str, str | None]]:
    """(source, path, status, reason) of every document held back from the index."""
    return conn.execute(
        """SELECT source, rel_path, status, held_reason FROM documents WHERE status = ANY(%s)
           ORDER BY source, rel_path""",
        (list(DOCUMENT_HELD),),
    ).fetchall()
