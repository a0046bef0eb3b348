"""Previous index versions reclaimed after their rollback window (the housekeeping job, `rag-pipeline gc`).

A promotion keeps the version it replaces as `previous`: its table stays and receives every write, so that `index
rollback` is instant and never serves a stale index. An index version is the size of the whole corpus, so a previous
version is dropped once `retention.rollback` has passed since it stopped being active, unless it is pinned (`index
pin V --reason ...`). An alert goes out `retention.rollback_warning` before (once per version), and the drop is
recorded with the version's events; a rollback after that is refused with the date it became impossible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import psycopg

from rag_pipeline import store
from rag_pipeline.lifecycle.alerts import Alert

RECLAIM_ALERT_KEY = "index_version:reclaim"


@dataclass
class ReclaimReport:
    reclaimed: list[dict[str, Any]] = field(default_factory=list)  # dropped now
    warned: list[dict[str, Any]] = field(default_factory=list)  # due within the warning, told now for the first time
    kept: list[dict[str, Any]] = field(default_factory=list)  # every previous version left, with when it goes

    @property
    def reclaimable_bytes(self) -> int:
        """What the previous versions that are not pinned hold: the storage reclaim frees over the window."""
        return sum(v["bytes"] for v in self.kept if not v["pinned"])

    def alerts(self, at: str) -> list[Alert]:
        """The warnings before a reclaim and the records after one, as alerts to every configured sink."""
        return [
            *(Alert(RECLAIM_ALERT_KEY, "warning", f"v{v['version']} ({v['embedding_model']}, {v['bytes']:,} bytes) "
                    f"is kept for rollback until {v['reclaim_at']:%Y-%m-%d %H:%M %Z} and then dropped; "
                    f"`rag-pipeline index pin {v['version']} --reason ...` keeps it", _plain(v), at)
              for v in self.warned),
            *(Alert(RECLAIM_ALERT_KEY, "done", f"v{v['version']} ({v['embedding_model']}) dropped after "
                    f"retention.rollback: {v['bytes']:,} bytes reclaimed; rollback to it is no longer possible",
                    _plain(v), at)
              for v in self.reclaimed),
        ]


def _plain(entry: dict[str, Any]) -> dict[str, Any]:
    return {key: value.isoformat() if isinstance(value, datetime) else value for key, value in entry.items()}


def reclaim_previous(conn: psycopg.Connection, keep_seconds: float, warn_seconds: float,
                     now: datetime | None = None) -> ReclaimReport:
    """Drop every previous version that is not pinned and stopped being active `keep_seconds` ago or more; mark
    (once) those due within `warn_seconds`. `now` is the database's clock unless given (tests move it). In the
    caller's transaction, under the registry lock: an index write never sees half of it."""
    store.versions.lock_registry(conn)
    if now is None:
        now = conn.execute("SELECT now()").fetchone()[0]
    report = ReclaimReport()
    for previous in store.versions.previous_versions(conn):
        version = previous.version
        due = previous.retired_at + timedelta(seconds=keep_seconds)
        entry = {"version": version.version_id, "embedding_model": version.embedding_model,
                 "rows": version.row_count, "bytes": previous.table_bytes, "previous_since": previous.retired_at,
                 "reclaim_at": None if previous.pinned_reason else due, "pinned": previous.pinned_reason is not None,
                 "pinned_reason": previous.pinned_reason}
        if previous.pinned_reason is None and now >= due:
            store.versions.drop(conn, version)
            store.versions.record_event(conn, version.version_id, "drop", False, {
                "reclaimed": True, "retention_seconds": keep_seconds, "rows": version.row_count,
                "bytes": previous.table_bytes})
            report.reclaimed.append(entry)
            continue
        if previous.pinned_reason is None and now >= due - timedelta(seconds=warn_seconds) and not previous.warned:
            store.versions.mark_reclaim_warned(conn, version.version_id)
            store.versions.record_event(conn, version.version_id, "reclaim_warning", False,
                                        {"reclaim_at": due.isoformat()})
            report.warned.append(entry)
        report.kept.append(entry)
    return report


def pin(conn: psycopg.Connection, version_id: int, reason: str | None) -> None:
    """Pin a version with a reason (never reclaimed while pinned), or unpin it (reason None): recorded."""
    if reason is not None and not reason.strip():
        raise ValueError("a pin needs a reason (it is recorded with the pin)")
    if not store.versions.set_pin(conn, version_id, reason.strip() if reason else None):
        raise LookupError(f"v{version_id}: no such index version with a table (see rag-pipeline index list)")
    store.versions.record_event(conn, version_id, "pin" if reason else "unpin", False,
                                {"reason": reason.strip()} if reason else {})
