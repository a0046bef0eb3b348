"""The states of a document and of an index version, and the transitions between them, written once.

Postgres enforces the document table wherever a status changes, including set-based updates (a trigger of
sql/functions/10_status.sql refuses any transition not listed); the lifecycle checks version transitions here before
it moves one, and the database refuses them too. A test keeps both copies in step: a new transition is added here
and in a new migration.

A document's life:

    (new file) --> pending_parse --> pending_chunk --> pending_index --> indexed
                        |   \\______ content unchanged ______________/
                        v               |
                   dead_letter <--------'  (over its time or memory
                                           budget while being chunked)
                   indexed / pending_index --> pending_index (labels changed, group lost its row)
                                           or pending_chunk (title or chunker changed)
    any state --> pending_parse (the file changed) or held_* (default-deny: held_no_labels without ACL labels,
                  held_bad_sidecar when a sidecar that applies cannot be read or validated, held_hard_link for a
                  file with other names that may carry other labels, held_source_removed when its source left
                  the configuration, held_erased when an erased document is back at its source and was not
                  re-admitted); a held document has nothing in the index
"""

from __future__ import annotations

from enum import StrEnum


class DocumentStatus(StrEnum):
    PENDING_PARSE = "pending_parse"
    PENDING_CHUNK = "pending_chunk"
    PENDING_INDEX = "pending_index"
    INDEXED = "indexed"
    DEAD_LETTER = "dead_letter"
    HELD_NO_LABELS = "held_no_labels"
    HELD_BAD_SIDECAR = "held_bad_sidecar"
    HELD_HARD_LINK = "held_hard_link"
    HELD_SOURCE_REMOVED = "held_source_removed"
    HELD_ERASED = "held_erased"


class VersionStatus(StrEnum):
    BUILDING = "building"  # receives every write while its backfill runs
    READY = "ready"  # backfill complete; still receives every write; may be promoted
    ACTIVE = "active"  # the one the alias names; readers use it
    PREVIOUS = "previous"  # was active; its table is kept (receiving every write) for rollback until reclaimed
    RETIRED = "retired"  # its table is dropped (retired by hand, reclaimed after retention.rollback, or never promoted)


D, V = DocumentStatus, VersionStatus

# Held back from the index, each for its reason (see above).
DOCUMENT_HELD = (D.HELD_NO_LABELS, D.HELD_BAD_SIDECAR, D.HELD_HARD_LINK, D.HELD_SOURCE_REMOVED, D.HELD_ERASED)
_HELD = frozenset(DOCUMENT_HELD)

DOCUMENT_TRANSITIONS: dict[DocumentStatus, frozenset[DocumentStatus]] = {
    D.PENDING_PARSE: frozenset({D.PENDING_CHUNK, D.INDEXED, D.DEAD_LETTER}) | _HELD,
    # dead_letter: a document over its time or memory budget while it is chunked (rag_pipeline.workers.pool).
    D.PENDING_CHUNK: frozenset({D.PENDING_INDEX, D.PENDING_PARSE, D.DEAD_LETTER}) | _HELD,
    D.PENDING_INDEX: frozenset({D.INDEXED, D.PENDING_CHUNK, D.PENDING_PARSE}) | _HELD,
    D.INDEXED: frozenset({D.PENDING_INDEX, D.PENDING_CHUNK, D.PENDING_PARSE}) | _HELD,
    D.DEAD_LETTER: frozenset({D.PENDING_PARSE}) | _HELD,
    # Released: parsed again, or re-chunked from the pages it kept while held.
    **{held: frozenset({D.PENDING_PARSE, D.PENDING_CHUNK}) | (_HELD - {held}) for held in DOCUMENT_HELD},
}

VERSION_TRANSITIONS: dict[VersionStatus, frozenset[VersionStatus]] = {
    V.BUILDING: frozenset({V.READY, V.ACTIVE, V.RETIRED}),
    V.READY: frozenset({V.ACTIVE, V.RETIRED}),
    V.ACTIVE: frozenset({V.PREVIOUS}),
    V.PREVIOUS: frozenset({V.ACTIVE, V.RETIRED}),  # rollback; or dropped
    V.RETIRED: frozenset(),  # its table is gone
}

# Documents whose chunks are (or are about to be) in the index: a near-duplicate group may be owned by them.
DOCUMENT_LIVE_IN_INDEX = (D.INDEXED, D.PENDING_INDEX)
# Documents with work left: the staleness check ages them.
DOCUMENT_QUEUED = (D.PENDING_PARSE, D.PENDING_CHUNK, D.PENDING_INDEX)
# Versions that receive every write: the active one, one being built or ready beside it, and a previous
# active one whose table is kept for rollback (so rolling back never serves a stale index).
VERSION_WRITABLE = (V.ACTIVE, V.BUILDING, V.READY, V.PREVIOUS)


class TransitionError(RuntimeError):
    """A state change the transition table does not allow."""


def check_version_transition(old: VersionStatus | str, new: VersionStatus | str) -> None:
    old, new = V(old), V(new)
    if old != new and new not in VERSION_TRANSITIONS[old]:
        raise TransitionError(f"an index version cannot go from {old} to {new}")
