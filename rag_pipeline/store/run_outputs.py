"""Step outputs of a run, as JSON in the index database (run_outputs; rag_pipeline.defs.io reads and writes)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.types.json import Jsonb

KEPT_DAYS = 7


def store(conn: psycopg.Connection, run_id: str, step_key: str, output_name: str, value: Any) -> None:
    with conn.transaction():
        conn.execute(
            """INSERT INTO run_outputs (run_id, step_key, output_name, value) VALUES (%s, %s, %s, %s)
               ON CONFLICT (run_id, step_key, output_name) DO UPDATE SET value = EXCLUDED.value, created_at = now()""",
            (run_id, step_key, output_name, Jsonb(value)),
        )
        conn.execute("DELETE FROM run_outputs WHERE run_id <> 'asset' AND created_at < now() - make_interval(days => %s)",
                     (KEPT_DAYS,))


def load(conn: psycopg.Connection, run_id: str, step_key: str, output_name: str) -> Any:
    row = conn.execute(
        "SELECT value FROM run_outputs WHERE run_id = %s AND step_key = %s AND output_name = %s",
        (run_id, step_key, output_name),
    ).fetchone()
    conn.commit()
    if row is None:
        raise KeyError(f"no output {output_name!r} of step {step_key!r} in run {run_id}")
    return row[0]


def of_run(conn: psycopg.Connection, run_ids: list[str], output_name: str) -> list[Any]:
    """Every step's output of that name in a run, in step order. `run_ids` is the run, then the run it re-executes,
    and so on: a step a re-execution skipped is taken from the nearest run that ran it."""
    rows = conn.execute(
        """SELECT DISTINCT ON (o.step_key) o.value
           FROM run_outputs o JOIN unnest(%s::text[]) WITH ORDINALITY AS lineage(run_id, nearness) USING (run_id)
           WHERE o.output_name = %s ORDER BY o.step_key, lineage.nearness""",
        (list(run_ids), output_name),
    ).fetchall()
    conn.commit()
    return [row[0] for row in rows]
