"""Metadata a person can read at a glance in the UI: typed tables (sortable columns, numbers as numbers), each
stage's counts (tier mix, skipped vs processed, reused vs embedded), and the index's totals beside what a run did."""

from collections.abc import Sequence
from typing import Any

import dagster as dg
import psycopg

from rag_pipeline import store
from rag_pipeline.domain.refs import document_name, without_path
from rag_pipeline.endpoints.redaction import redact_credentials, redact_value
from rag_pipeline.stages.chunk import ChunkStats
from rag_pipeline.stages.index import IndexStats
from rag_pipeline.stages.parse import ParseStats

_COLUMN_TYPES = ((bool, "bool"), (int, "int"), (float, "float"))


def _column_type(values: list[Any]) -> str:
    present = [v for v in values if v is not None]
    for kind, name in _COLUMN_TYPES:
        if present and all(isinstance(v, kind) and (kind is bool or not isinstance(v, bool)) for v in present):
            return name
    if present and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present):
        return "float"
    return "string"


def typed_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> dg.MetadataValue:
    """A table the UI shows with typed columns; cells that are not numbers or booleans become text."""
    columns = [list(column) for column in zip(*rows, strict=True)] if rows else [[] for _ in header]
    types = [_column_type(values) for values in columns]

    def cell(value: Any, kind: str) -> Any:
        if value is None or kind != "string":
            return value
        return redact_credentials(str(value))  # a problem's text may name an object store's URL

    return dg.MetadataValue.table(
        records=[dg.TableRecord({name: cell(value, kind) for name, value, kind in zip(header, row, types, strict=True)})
                 for row in rows],
        schema=dg.TableSchema(columns=[dg.TableColumn(name, kind) for name, kind in zip(header, types, strict=True)]),
    )


def without_credentials(metadata: dict[str, Any]) -> dict[str, Any]:
    """Metadata as Dagster may keep it: no credential in any text of it (tables, JSON, text, Markdown)."""
    return {name: _without_credentials(value) for name, value in metadata.items()}


def _without_credentials(value: Any) -> Any:
    if isinstance(value, dg.TableMetadataValue):
        return dg.MetadataValue.table(records=[dg.TableRecord(redact_value(dict(r.data))) for r in value.records],
                                      schema=value.schema)
    if isinstance(value, dg.JsonMetadataValue):
        return dg.MetadataValue.json(redact_value(value.data))
    if isinstance(value, dg.TextMetadataValue):
        return dg.MetadataValue.text(redact_credentials(value.text))
    if isinstance(value, dg.MarkdownMetadataValue):
        return dg.MetadataValue.md(redact_credentials(value.md_str))
    return redact_value(value)


def index_totals(conn: psycopg.Connection) -> dict[str, Any]:
    """The whole index, whatever this run did: numbers the UI plots over time, and pages by tier."""
    totals = store.health.index_totals(conn)
    metadata: dict[str, Any] = {f"index_{name}": dg.MetadataValue.int(value) for name, value in totals.counts.items()}
    metadata["index_pages_by_tier"] = typed_table(("tier", "pages"), sorted(totals.pages_by_tier.items()))
    return metadata


def document_table(conn: psycopg.Connection, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> dg.MetadataValue:
    """typed_table with documents named by ref, never by path: a `path` column (beside `source`) becomes
    `document`, a `doc_id` column (a hash of the path, so a guess could be confirmed) is dropped. Dagster's storage
    then keeps no path of a document that is erased from the index database."""
    if "path" not in header or "source" not in header:
        return typed_table(header, rows)
    source_at, path_at = header.index("source"), header.index("path")
    refs = store.documents.refs_of(conn, [(row[source_at], row[path_at]) for row in rows])
    keep = [i for i, name in enumerate(header) if name != "doc_id"]
    named = []
    for row in rows:
        path = row[path_at]
        name = document_name(refs.get((row[source_at], path)))
        named.append([name if i == path_at else without_path(row[i], path, name) for i in keep])
    return typed_table(["document" if i == path_at else header[i] for i in keep], named)


def parse_metadata(stats: ParseStats, dead: list[dict], workers: int, replaced: int,
               hosts: list[str]) -> dict:
    return {
        "parsed": stats.parsed,
        "requeued_for_new_parser": stats.requeued_for_new_parser,
        "content_unchanged": stats.content_unchanged,
        "dead_lettered": stats.dead_lettered,
        "pages": stats.pages,
        "seconds": round(stats.seconds, 3),
        "pages_per_second": round(stats.pages / stats.seconds, 2) if stats.seconds else 0.0,
        "workers": workers,
        "workers_replaced": replaced,
        "steps": typed_table(("step process",), [(host,) for host in hosts]),
        "tier_mix": typed_table(("tier", "pages"), sorted(stats.tiers.items())),
        "pages_escalated": stats.escalated,
        "pages_unresolved": stats.unresolved_pages,
        # Object stores: what the parse workers downloaded; objects skipped are the scan's `unchanged`.
        "objects_downloaded": stats.objects_downloaded,
        "bytes_downloaded": dg.MetadataValue.int(stats.bytes_downloaded),
        "left_for_next_run": stats.changed_since_scan + stats.unreadable,
        "escalations": typed_table(("reason", "pages"), sorted(stats.escalation_reasons.items())),
        "pictures": typed_table(("kind", "pictures"), sorted(stats.pictures.items())),
        # parsing.vlm.describe_pictures: asked of the model, read from the cache, left without (budget, timeout)
        "picture_descriptions": typed_table(("outcome", "pictures"), [
            ("described", stats.pictures_described), ("cached", stats.picture_descriptions_cached),
            ("over_budget", stats.pictures_over_budget), ("failed", stats.picture_description_failures)]),
        "tiers_unavailable": typed_table(("tier", "why"), sorted(stats.tiers_unavailable.items())),
        "chars_removed_by_cleaning": typed_table(("rule", "characters"), sorted(stats.chars_removed.items())),
        "dead_letters_this_run": typed_table(("reason", "documents"), sorted(stats.dead_letter_reasons.items())),
        "dead_letters_all": typed_table(
            ("source", "document", "reason", "attempts"),
            [(d["source"], document_name(d["ref"]), d["reason"], d["attempts"]) for d in dead[:50]],
        ),
        "stats": dg.MetadataValue.json(stats.as_dict()),
    }


def chunk_metadata(stats: ChunkStats) -> dict:
    summary = stats.as_dict()
    summary.pop("token_counts")
    return {
        "documents_chunked": stats.documents_chunked,
        "chunks_written": stats.chunks_written,
        "figure_chunks": stats.figure_chunks,  # of chunks_written: a chunk per picture that says something
        "requeued_for_new_chunker": stats.requeued_for_new_chunker,
        "chunker_version": stats.chunker_version,
        "llm_prefixes_generated": stats.prefixes_generated,
        "llm_prefixes_cached": stats.prefixes_cached,
        "llm_prefix_failures": stats.prefix_failures,
        "worker_seconds": round(stats.seconds, 3),
        "chunk_tokens": typed_table(("statistic", "tokens"), list(stats.token_distribution().items())),
        # what the documents chunked say they are: each identity field and where it was read (docs/parsing.md)
        "identity_found": typed_table(("field: where", "documents"), sorted(stats.identity_found.items())),
        "stats": dg.MetadataValue.json(summary),
    }


def index_metadata(stats: IndexStats, statuses: dict[str, int], all_versions: list) -> dict:
    return {
        "documents_indexed": stats.documents_indexed,
        "vectors_embedded": stats.vectors_embedded,
        "vectors_reused": stats.vectors_reused,
        "rows_written": stats.rows_written,
        "near_duplicates": stats.near_duplicates,
        "dedup_rate": stats.dedup_rate,
        "seconds": round(stats.seconds, 3),
        "chunks_per_second": round(stats.chunks_indexed / stats.seconds, 2) if stats.seconds else 0.0,
        "index_versions": typed_table(
            ("version", "status", "model", "identity", "dims", "rows"),
            [(v.label, v.status, v.embedding_model, v.model_identity or "not recorded yet", v.dimensions, v.row_count)
             for v in all_versions],
        ),
        "documents_by_status": typed_table(("status", "documents"), sorted(statuses.items())),
        "tables_vacuumed": typed_table(("table",), [(name,) for name in stats.tables_vacuumed]),
        "stats": dg.MetadataValue.json(stats.as_dict()),
    }
