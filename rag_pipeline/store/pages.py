"""Parsed pages (per-page Markdown, the tier that produced it and its signals) and dead letters."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from rag_pipeline.parsing.pages import ParsedPage
from rag_pipeline.parsing.pictures import Picture, picture_from_record

DETAIL_CHARS = 2000  # a dead letter's detail is for people; a parser's megabyte of traceback is not


def replace_pages(conn: psycopg.Connection, doc_id: str, pages: Iterable[ParsedPage], parser_version: str) -> None:
    conn.execute("DELETE FROM document_pages WHERE doc_id = %s", (doc_id,))
    with conn.cursor().copy(
        "COPY document_pages (doc_id, page, tier, signals, parser_version, seconds, markdown) FROM STDIN"
    ) as copy:
        for page in pages:
            copy.write_row(
                (doc_id, page.page, page.tier, Jsonb(page.signals), parser_version, page.seconds, page.markdown)
            )


def document_pages(conn: psycopg.Connection, doc_id: str) -> list[tuple[int, str]]:
    return [
        (page, markdown)
        for page, markdown in conn.execute(
            "SELECT page, markdown FROM document_pages WHERE doc_id = %s ORDER BY page", (doc_id,)
        ).fetchall()
    ]


def pdf_metadata(conn: psycopg.Connection, doc_id: str) -> dict[str, str]:
    """The PDF document-information fields parsing kept on the first page's signals (rag_pipeline.parsing.pdf)."""
    row = conn.execute("SELECT signals -> 'pdf_metadata' FROM document_pages WHERE doc_id = %s AND page = 1",
                       (doc_id,)).fetchone()
    return row[0] if row and isinstance(row[0], dict) else {}


def document_pictures(conn: psycopg.Connection, doc_id: str) -> list[Picture]:
    """The pictures parsing found on the document's pages (rag_pipeline.parsing.pictures), page by page."""
    rows = conn.execute("""SELECT page, signals -> 'pictures' FROM document_pages
                           WHERE doc_id = %s AND signals ? 'pictures' ORDER BY page""", (doc_id,)).fetchall()
    return [picture for page, records in rows if isinstance(records, list)
            for picture in (picture_from_record(page, record) for record in records) if picture]


def picture_records(conn: psycopg.Connection, doc_id: str) -> list[Any]:
    """Each stored page's pictures as parsing recorded them (None for a page without), in page order."""
    return [row[0] for row in conn.execute(
        "SELECT signals -> 'pictures' FROM document_pages WHERE doc_id = %s ORDER BY page", (doc_id,)).fetchall()]


def cached_description(conn: psycopg.Connection, doc_id: str, image_sha256: str, prompt_version: str,
                       model: str) -> str | None:
    with conn.transaction():  # ended here: a worker's connection is not left inside a transaction
        row = conn.execute(
            "SELECT description FROM picture_descriptions WHERE doc_id = %s AND image_sha256 = %s"
            " AND prompt_version = %s AND model = %s", (doc_id, image_sha256, prompt_version, model)).fetchone()
    return row[0] if row else None


def keep_description(conn: psycopg.Connection, doc_id: str, image_sha256: str, prompt_version: str, model: str,
                     description: str) -> None:
    """Committed at once: what the model was paid for survives a parse that fails later."""
    with conn.transaction():
        conn.execute(
            """INSERT INTO picture_descriptions (doc_id, image_sha256, prompt_version, model, description)
               VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING""",
            (doc_id, image_sha256, prompt_version, model, description))


def table_continuations(conn: psycopg.Connection, doc_id: str) -> dict[int, int]:
    """Pages whose last table runs on over page breaks -> the last page it reaches."""
    rows = conn.execute(
        """SELECT page, (signals->>'table_continues_to')::int FROM document_pages
           WHERE doc_id = %s AND signals ? 'table_continues_to'""",
        (doc_id,),
    ).fetchall()
    return dict(rows)


def record_dead_letter(conn: psycopg.Connection, doc_id: str, reason: str, detail: str, fingerprint: str) -> None:
    """Park a document with its reason; it is retried when its fingerprint changes."""
    conn.execute(
        """INSERT INTO dead_letters (doc_id, reason, detail, fingerprint) VALUES (%s, %s, %s, %s)
           ON CONFLICT (doc_id) DO UPDATE SET reason = EXCLUDED.reason, detail = EXCLUDED.detail,
               fingerprint = EXCLUDED.fingerprint, attempts = dead_letters.attempts + 1, last_failed_at = now()""",
        (doc_id, reason, detail[:DETAIL_CHARS], fingerprint),
    )


def clear_dead_letter(conn: psycopg.Connection, doc_id: str) -> None:
    conn.execute("DELETE FROM dead_letters WHERE doc_id = %s", (doc_id,))


def dead_letter_summary(conn: psycopg.Connection) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(
            """SELECT d.source, d.rel_path, d.ref, l.reason, l.detail, l.attempts
               FROM dead_letters l JOIN documents d USING (doc_id) ORDER BY d.source, d.rel_path"""
        ).fetchall()
