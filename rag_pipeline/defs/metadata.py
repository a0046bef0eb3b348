"""Metadata a person can read at a glance in the UI: typed tables (sortable columns, numbers as numbers), and the
index's totals beside what a run did."""

from collections.abc import Sequence
from typing import Any

import dagster as dg
import psycopg

from rag_pipeline import store
from rag_pipeline.domain.refs import document_name, without_path

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
        return str(value)

    return dg.MetadataValue.table(
        records=[dg.TableRecord({name: cell(value, kind) for name, value, kind in zip(header, row, types, strict=True)})
                 for row in rows],
        schema=dg.TableSchema(columns=[dg.TableColumn(name, kind) for name, kind in zip(header, types, strict=True)]),
    )


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
