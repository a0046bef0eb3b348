"""Metadata a person can read at a glance in the UI."""

from collections.abc import Sequence
from typing import Any

import dagster as dg


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> dg.MetadataValue:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in row) + " |" for row in rows]
    return dg.MetadataValue.md("\n".join(lines) if rows else "_none_")
