"""Previous index versions reclaimed after their rollback window (the housekeeping job, `rag-pipeline gc`).

A promotion keeps the version it replaces as `previous`: its table stays and receives every write, so that `index
rollback` is instant and never serves a stale index. An index version is the size of the whole corpus, so a previous
version is dropped once `retention.rollback` has passed since it stopped being active, unless it is pinned (`index
pin V --reason ...`). An alert goes out `retention.rollback_warning` before, once per version, and a version is
never dropped sooner than that after its alert (one overdue when first seen, from before this release or while
housekeeping was off, is warned first and dropped a warning period later). The drop is recorded with the
version's events, and a rollback after it is refused with the date it became impossible.

Chunks are sized for the shortest model window among the writable versions: dropping the version with the
shortest window lets the next refresh chunk (and embed) the corpus again for the longer one (docs/operations.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from rag_pipeline import store
from rag_pipeline.config import RetentionConfig
from rag_pipeline.lifecycle.alerts import Alert, AlertSender
from rag_pipeline.store.database import connect, index_write_lock
from rag_pipeline.store.versions import PreviousVersion

RECLAIM_ALERT_KEY = "index_version:reclaim:"  # + the version's label: one key per version
DROP_LOCK_TIMEOUT = "10s"  # a reader of the table (a backup, `eval V`) keeps it: tried again at the next run


@dataclass
class ReclaimReport:
    reclaimed: list[dict[str, Any]] = field(default_factory=list)  # dropped now
    warned: list[dict[str, Any]] = field(default_factory=list)  # warned now, for the first time
    kept: list[dict[str, Any]] = field(default_factory=list)  # every previous version left, with when it goes

    @property
    def reclaimable_bytes(self) -> int:
        """What the previous versions that are not pinned hold: the storage reclaim frees over the window."""
        return sum(v["bytes"] for v in self.kept if not v["pinned"])

    def alerts(self, at: str) -> list[Alert]:
        """The warnings before a reclaim and the records after one, as alerts to every configured sink."""
        return [
            *(Alert(RECLAIM_ALERT_KEY + f"v{v['version']}", "warning",
                    f"v{v['version']} ({v['embedding_model']}, {v['bytes']:,} bytes) is kept for rollback until "
                    f"{v['reclaim_at']:%Y-%m-%d %H:%M} UTC and then dropped; `rag-pipeline index pin {v['version']} "
                    f"--reason ...` keeps it", _plain(v), at)
              for v in self.warned),
            *(Alert(RECLAIM_ALERT_KEY + f"v{v['version']}", "done",
                    f"v{v['version']} ({v['embedding_model']}) dropped after retention.rollback: {v['bytes']:,} "
                    "bytes reclaimed; rollback to it is no longer possible", _plain(v), at)
              for v in self.reclaimed),
        ]


def _plain(entry: dict[str, Any]) -> dict[str, Any]:
    return {key: value.isoformat() if isinstance(value, datetime) else value for key, value in entry.items()}


def standing_warning(previous: PreviousVersion) -> datetime | None:
    """When the version was warned of its reclaim, if during this stay as previous (a warning given before it was
    last active speaks of another stay)."""
    warned = previous.warned_at
    return warned if warned is not None and warned >= previous.retired_at else None


def reclaim_due(previous: PreviousVersion, keep_seconds: float, warn_seconds: float, now: datetime) -> datetime:
    """When a previous version is dropped: `keep_seconds` after it stopped being active, and never sooner than
    `warn_seconds` after its warning (one not warned yet is warned now). In UTC: a window in days is not moved by a
    change of summer time."""
    warned = standing_warning(previous)
    return max(previous.retired_at.astimezone(UTC) + timedelta(seconds=keep_seconds),
               (warned or now).astimezone(UTC) + timedelta(seconds=warn_seconds))


def reclaim_previous(conn: psycopg.Connection, keep_seconds: float, warn_seconds: float,
                     now: datetime | None = None) -> ReclaimReport:
    """Drop every previous version that is not pinned and is due (reclaim_due); warn (once) those due within
    `warn_seconds`, or overdue and not warned yet. `now` is the database's clock unless given (tests move it). In
    the caller's transaction, under the registry lock (no index write half-sees it); the caller holds the
    exclusive index write lock (reclaim_versions)."""
    store.versions.lock_registry(conn)
    now = (now or store.versions.database_now(conn)).astimezone(UTC)
    report = ReclaimReport()
    for previous in store.versions.previous_versions(conn):
        version = previous.version
        warned_at = standing_warning(previous)
        due = reclaim_due(previous, keep_seconds, warn_seconds, now)
        entry = {"version": version.version_id, "embedding_model": version.embedding_model,
                 "rows": version.row_count, "bytes": previous.table_bytes, "previous_since": previous.retired_at,
                 "reclaim_at": None if previous.pinned_reason else due,
                 "pinned": previous.pinned_reason is not None, "pinned_reason": previous.pinned_reason}
        if previous.pinned_reason is not None:
            report.kept.append(entry)
            continue
        if warned_at is not None and now >= due and store.versions.drop_unless_busy(conn, version, DROP_LOCK_TIMEOUT):
            store.versions.record_event(conn, version.version_id, "drop", False, {
                "reclaimed": True, "retention_seconds": keep_seconds, "rows": version.row_count,
                "bytes": previous.table_bytes})
            report.reclaimed.append(entry)
            continue
        if warned_at is None and now >= due - timedelta(seconds=warn_seconds):
            store.versions.mark_reclaim_warned(conn, version.version_id, now)
            store.versions.record_event(conn, version.version_id, "reclaim_warning", False,
                                        {"reclaim_at": due.isoformat()})
            report.warned.append(entry)
        report.kept.append(entry)
    return report


def reclaim_versions(db_url: str, retention: RetentionConfig, sender: AlertSender,
                     lock_timeout_seconds: float = 3600) -> ReclaimReport:
    """reclaim_previous under the exclusive index write lock (a refresh, a backfill or an erasure holds a version
    list it read before), committed; its alerts are sent once the lock is released (a slow webhook must not stall
    the index writers). A delivery that fails is logged by the sender (rag_pipeline.alert_delivery_failed); the
    warning is recorded with the version's events either way."""
    with index_write_lock(db_url, "housekeeping", timeout_seconds=lock_timeout_seconds), connect(db_url) as conn, \
            conn.transaction():
        report = reclaim_previous(conn, retention.rollback_seconds, retention.rollback_warning_seconds)
    for alert in report.alerts(datetime.now(UTC).isoformat(timespec="seconds")):
        sender.send(alert)
    return report


def pin(conn: psycopg.Connection, version_id: int, reason: str | None) -> None:
    """Pin a version with a reason (never reclaimed while pinned), or unpin it (reason None): recorded. Under the
    registry lock: a reclaim running now sees the pin, or has dropped the version before it."""
    if reason is not None and not reason.strip():
        raise ValueError("a pin needs a reason (it is recorded with the pin)")
    store.versions.lock_registry(conn)
    version = store.versions.get_version(conn, version_id)
    if version is None:
        raise LookupError(f"v{version_id}: no such index version with a table (see rag-pipeline index list)")
    if reason is None and store.versions.pinned_reason(conn, version_id) is None:
        raise LookupError(f"v{version_id} is not pinned")
    store.versions.set_pin(conn, version_id, reason.strip() if reason else None)
    store.versions.record_event(conn, version_id, "pin" if reason else "unpin", False,
                                {"reason": reason.strip()} if reason else {})
