"""A scan reconciled with the documents table, in SQL so it scales with the corpus: the scan staged into a
temporary table, what it did not find counted and deleted, new and changed documents applied. Whether a scan
may delete is decided by the discover stage (rag_pipeline.stages.discover.DeletionGuard), not here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import psycopg
from psycopg import sql

from rag_pipeline.domain import ids
from rag_pipeline.domain.status import DOCUMENT_HELD, DocumentStatus
from rag_pipeline.sources.folders import ETAG_ID, DiscoveredFile
from rag_pipeline.store import groups, versions

D = DocumentStatus
# Every status by name, for statements that name several: bound as parameters, never written as literals.
_STATUS = {status.name.lower(): status.value for status in DocumentStatus}


@dataclass
class ReconcileCounts:
    seen: int = 0
    new: int = 0
    changed: int = 0
    released: int = 0  # held before, admissible now
    retitled: int = 0
    relabelled: int = 0  # labels changed (updated in place on every row at once), alone or with other changes
    held: int = 0  # newly held back (no labels, a bad sidecar, hard links)
    deleted: int = 0
    deletions_held: int = 0  # what a guarded scan would have deleted, and did not
    deletions_held_reason: str | None = None
    adopted: int = 0  # new objects that took the parsed pages of an object with the same ETag (moved, copied)
    # The first documents (doc_ids) of each class above, and their refs: what a refresh names, as its preview does
    # (stages.preview). A deleted document's ref is read before it goes.
    documents: dict[str, list[str]] = field(default_factory=dict)
    refs: dict[str, int] = field(default_factory=dict)

    @property
    def unchanged(self) -> int:
        return self.seen - self.new - self.changed - self.released - self.retitled


def _judged(unreadable: Sequence[str]) -> sql.Composable:
    """Documents of the source a scan could judge: all but those under paths it could not read (the usual scan
    has none, and then the condition is the source alone: a per-row test of an empty list misleads the planner)."""
    if not unreadable:
        return sql.SQL("d.source = %(source)s")
    return sql.SQL("d.source = %(source)s AND NOT {under}").format(under=_under_unreadable("d"))


def _under_unreadable(alias: str) -> sql.Composable:
    """A row of `alias` at or under one of the paths %(unreadable)s ('.' is the whole source)."""
    return sql.SQL("""EXISTS (SELECT 1 FROM unnest(%(unreadable)s::text[]) u
                              WHERE u = '.' OR {path} = u OR starts_with({path}, u || '/'))""").format(
        path=sql.Identifier(alias, "rel_path"))


def _gone(unreadable: Sequence[str]) -> sql.Composable:
    """Documents of the source its scan did not find, except those under paths the scan could not read."""
    return sql.SQL("{judged} AND NOT EXISTS (SELECT 1 FROM scan_files s WHERE s.doc_id = d.doc_id)").format(
        judged=_judged(unreadable))


def _hold_of(f: DiscoveredFile) -> tuple[str | None, str | None]:
    if f.held:
        return f.held[0].value, f.held[1]
    if not f.acl_labels:
        return D.HELD_NO_LABELS.value, "no ACL labels"
    return None, None


def stage_scan(conn: psycopg.Connection, files: Iterable[DiscoveredFile]) -> tuple[int, list[str]]:
    """Stream one scan of a source into a temporary table (COPY) for the set operations of this transaction;
    returns the number of files seen and the names listed more than once (staged neither time). A file yielded
    again with `rejudged` replaces its first judgment. Reconciliation is in SQL so it scales with the corpus."""
    conn.execute(
        """CREATE TEMP TABLE scan_files (
               doc_id text NOT NULL, rel_path text NOT NULL, fingerprint text NOT NULL,
               size_bytes bigint NOT NULL, modified_at timestamptz NOT NULL, acl_labels text[] NOT NULL,
               title text, metadata jsonb NOT NULL, hold_status text, hold_reason text,
               file_id text, file_links integer, read_path text, rejudged boolean NOT NULL) ON COMMIT DROP"""
    )
    seen = rejudged = 0
    labels_literals: dict[tuple[str, ...], str] = {}
    with conn.cursor().copy(
        "COPY scan_files (doc_id, rel_path, fingerprint, size_bytes, modified_at, acl_labels, title, metadata,"
        " hold_status, hold_reason, file_id, file_links, read_path, rejudged) FROM STDIN"
    ) as copy:
        for f in files:
            if f.rejudged:
                rejudged += 1
            else:
                seen += 1
            # Labels and metadata go as their text forms (a source's label sets are few): a scan of 100,000
            # objects spends a third of the time of adapting them per row.
            labels = labels_literals.get(f.acl_labels)
            if labels is None:
                labels = labels_literals[f.acl_labels] = array_literal(f.acl_labels)
            copy.write_row(
                (
                    f.doc_id, f.rel_path, f.fingerprint, f.size_bytes,
                    datetime.fromtimestamp(f.mtime_ns / 1e9, tz=UTC), labels, f.title,
                    json.dumps(f.metadata) if f.metadata else "{}", *_hold_of(f),
                    f.file_id, f.file_links, f.read_path, f.rejudged,
                )
            )
    # A name listed twice (an object store's client lists 'a.md/' as 'a.md') is ambiguous: neither entry counts,
    # and the document of that name is kept as it was (the caller adds the names to the scan's unreadable paths).
    # Names are counted among first judgments: a second judgment of one listing of the name is not a second name.
    duplicates: list[str] = []
    if rejudged:
        duplicates = _unstage_duplicates(conn)
        conn.execute("DELETE FROM scan_files s WHERE NOT s.rejudged"
                     " AND EXISTS (SELECT 1 FROM scan_files r WHERE r.rejudged AND r.doc_id = s.doc_id)")
        conn.execute("ALTER TABLE scan_files ADD PRIMARY KEY (doc_id)")
    else:
        try:  # the primary key finds them, in a savepoint: the usual scan has none and pays for no search
            with conn.transaction():
                conn.execute("ALTER TABLE scan_files ADD PRIMARY KEY (doc_id)")
        except psycopg.errors.UniqueViolation:
            duplicates = _unstage_duplicates(conn)
            conn.execute("ALTER TABLE scan_files ADD PRIMARY KEY (doc_id)")
    # A sample of 3,000 rows plans these joins as well as the default 30,000, at a sixth of the time.
    (before,) = conn.execute("SELECT current_setting('default_statistics_target')").fetchone()
    conn.execute("SELECT set_config('default_statistics_target', '10', true)")
    conn.execute("ANALYZE scan_files")
    conn.execute("SELECT set_config('default_statistics_target', %s, true)", (before,))
    return seen, sorted(set(duplicates))


def _unstage_duplicates(conn: psycopg.Connection) -> list[str]:
    return [r[0] for r in conn.execute(
        "DELETE FROM scan_files WHERE doc_id IN (SELECT doc_id FROM scan_files WHERE NOT rejudged GROUP BY doc_id"
        " HAVING count(*) > 1) RETURNING rel_path").fetchall()]


def drop_unreadable(conn: psycopg.Connection, unreadable: Sequence[str]) -> None:
    """Unstage what the scan staged under paths it then could not read (an object rewritten before its second
    judgment): those documents are kept as they were, not changed to a judgment the scan did not finish."""
    if unreadable:
        conn.execute(
            sql.SQL("DELETE FROM scan_files s WHERE {under}").format(under=_under_unreadable("s")),
            {"unreadable": list(unreadable)},
        )


def array_literal(items: Sequence[str]) -> str:
    """PostgreSQL's text form of a text[]: every element quoted, with its quotes and backslashes escaped."""
    return "{" + ",".join('"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"' for item in items) + "}"


def stored_labels(conn: psycopg.Connection, source: str, rel_paths: Sequence[str],
                  racy: tuple[datetime, datetime] | None = None) -> dict[str, tuple[str, tuple[str, ...]]]:
    """(fingerprint, labels) of the source's documents at these paths that are not held: an object whose
    fingerprint is unchanged keeps the labels its metadata gave, without reading the metadata again. Not those
    modified within `racy` (since, until: racily clean, rewritten, metadata and all, within the second the scan
    that stored them listed them, their fingerprint says nothing)."""
    since, until = racy or (None, None)
    rows = conn.execute(
        "SELECT rel_path, fingerprint, acl_labels FROM documents WHERE source = %s AND rel_path = ANY(%s)"
        " AND NOT status = ANY(%s)"
        " AND NOT coalesce(modified_at BETWEEN %s::timestamptz AND %s::timestamptz, false)",
        (source, list(rel_paths), list(DOCUMENT_HELD), since, until),
    ).fetchall()
    return {rel_path: (fingerprint, tuple(labels)) for rel_path, fingerprint, labels in rows}


def stage_twins(conn: psycopg.Connection, source: str) -> None:
    """The staged scan's new objects that have a twin (see adopt_moved), as the temporary table scan_twins
    (new_id, old_id)."""
    # Only an ETag shaped as an MD5 digest, in hex or base64 (S3's single-part upload, a GCS object; an S3
    # multipart upload's digest of part digests with its part count) names the bytes: Azure's, or an opaque one,
    # may not, and equal ETags then say nothing about equal content.
    params = {"source": source,
              "digest": rf'^{ETAG_ID}"?([0-9a-fA-F]{{32}}(-[0-9]+)?|[A-Za-z0-9+/]{{22}}==)"?$',
              "parsed": [D.INDEXED.value, D.PENDING_CHUNK.value, D.PENDING_INDEX.value]}
    conn.execute(
        """CREATE TEMP TABLE scan_twins ON COMMIT DROP AS
           SELECT DISTINCT ON (s.doc_id) s.doc_id AS new_id, d.doc_id AS old_id
           FROM scan_files s JOIN documents d ON d.source = %(source)s AND d.file_id = s.file_id
                                            AND d.size_bytes = s.size_bytes
           WHERE s.file_id ~ %(digest)s AND s.hold_status IS NULL AND cardinality(s.acl_labels) > 0
             AND d.status = ANY(%(parsed)s) AND d.content_hash IS NOT NULL
             AND NOT EXISTS (SELECT 1 FROM documents x WHERE x.doc_id = s.doc_id)
           ORDER BY s.doc_id, d.doc_id""",
        params,
    )


def adopt_moved(conn: psycopg.Connection, source: str, named: int) -> tuple[int, list[str]]:
    """Insert the staged scan's new objects that have a twin: a parsed document of the same source with the same
    ETag and size (a move, or a copy). Each takes its twin's pages and goes to chunking; its chunks' vectors come
    from the embedding cache. Nothing is downloaded or parsed again. Labels, title and metadata are the new
    object's own. Runs before deletions, so a move finds the document it left. Returns how many, and the doc_ids
    of the first `named`."""
    params = {"source": source, **_STATUS}
    stage_twins(conn, source)
    adopted = conn.execute(
        """INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at, acl_labels, title,
                                  metadata, status, file_id, content_hash, page_count, parser_version, cleaning,
                                  parsed_at)
           SELECT s.doc_id, %(source)s, s.rel_path, s.fingerprint, s.size_bytes, s.modified_at, s.acl_labels,
                  s.title, s.metadata, %(pending_chunk)s, s.file_id, d.content_hash, d.page_count,
                  d.parser_version, d.cleaning, now()
           FROM scan_twins t JOIN scan_files s ON s.doc_id = t.new_id JOIN documents d ON d.doc_id = t.old_id""",
        params,
    ).rowcount
    conn.execute(
        """INSERT INTO document_pages (doc_id, page, tier, signals, parser_version, seconds, markdown)
           SELECT t.new_id, p.page, p.tier, p.signals, p.parser_version, p.seconds, p.markdown
           FROM scan_twins t JOIN document_pages p ON p.doc_id = t.old_id"""
    )
    names = [r[0] for r in conn.execute("SELECT new_id FROM scan_twins ORDER BY new_id LIMIT %s", (named,))]
    conn.execute("DROP TABLE scan_twins")
    return adopted, names


def count_gone(conn: psycopg.Connection, source: str, unreadable: Sequence[str]) -> tuple[int, int]:
    """(documents of the source the staged scan did not find, documents the scan could judge): documents under
    paths the scan could not read are in neither."""
    missing, total = conn.execute(
        sql.SQL("""SELECT count(*) FILTER (WHERE s.doc_id IS NULL), count(*)
                   FROM documents d LEFT JOIN scan_files s ON s.doc_id = d.doc_id WHERE {judged}""").format(
            judged=_judged(unreadable)),
        {"source": source, "unreadable": list(unreadable)},
    ).fetchone()
    return missing, total


@dataclass(frozen=True)
class StoredDocument:
    """What the documents table holds of a document a scan changes (a refresh's preview reports it)."""

    doc_id: str
    ref: int
    rel_path: str
    status: str
    has_pages: bool  # parsed text kept: chunked again without parsing
    page_count: int | None
    size_bytes: int
    chunks: int


_STORED = sql.SQL("""d.doc_id, d.ref, d.rel_path, d.status, d.content_hash IS NOT NULL, d.page_count, d.size_bytes,
                     (SELECT count(*) FROM chunks c WHERE c.doc_id = d.doc_id)""")


def gone_documents(conn: psycopg.Connection, source: str, unreadable: Sequence[str],
                   limit: int | None = None) -> Iterator[StoredDocument]:
    """The documents count_gone counts as missing (the first `limit` by path), streamed."""
    with conn.cursor(name="gone_documents") as cursor:
        cursor.execute(sql.SQL("SELECT {} FROM documents d WHERE {} ORDER BY d.rel_path LIMIT %(limit)s").format(
            _STORED, _gone(unreadable)), {"source": source, "unreadable": list(unreadable), "limit": limit})
        for row in cursor:
            yield StoredDocument(*row)


def documents_to_hold(conn: psycopg.Connection, source: str, limit: int) -> list[StoredDocument]:
    """The first `limit` documents (by path) of a source that left the configuration that are not held yet
    (store.sources.documents_to_hold counts them all)."""
    return [StoredDocument(*row) for row in conn.execute(
        sql.SQL("SELECT {} FROM documents d WHERE d.source = %s AND d.status <> %s ORDER BY d.rel_path LIMIT %s")
        .format(_STORED), (source, D.HELD_SOURCE_REMOVED.value, limit)).fetchall()]


def delete_gone(conn: psycopg.Connection, source: str, unreadable: Sequence[str]) -> int:
    """Delete the documents the staged scan did not find (cascading to pages, chunks and every index version),
    write them to the deletion log, and repair the near-duplicate groups that lost occurrences."""
    params = {"source": source, "unreadable": list(unreadable)}
    gone = _gone(unreadable)
    # Groups that lose occurrences with the deleted documents must be repaired after the deletion.
    touched_groups = [r[0] for r in conn.execute(
        sql.SQL("""SELECT DISTINCT c.group_id FROM chunks c JOIN documents d USING (doc_id)
                   WHERE {gone} AND c.group_id IS NOT NULL""").format(gone=gone), params,
    ).fetchall()]
    remember_embedding_inputs(conn, [r[0] for r in conn.execute(
        sql.SQL("SELECT d.doc_id FROM documents d WHERE {gone}").format(gone=gone), params).fetchall()])
    deleted = conn.execute(
        sql.SQL("""WITH gone AS (
                       DELETE FROM documents d WHERE {gone}
                       RETURNING d.doc_id, d.source, d.rel_path)
                   INSERT INTO deletion_log (doc_id, source, rel_path)
                   SELECT doc_id, source, rel_path FROM gone""").format(gone=gone),
        params,
    ).rowcount
    repair_groups(conn, touched_groups)
    return deleted


# The classes of classify_scan, as a refresh counts and names them.
CLASSIFIED = ("new", "changed", "released", "retitled", "relabelled", "held")


def _racy_params(source: str, racy: tuple[datetime, datetime] | None) -> dict[str, object]:
    since, until = racy or (None, None)
    return {"source": source, "held": list(DOCUMENT_HELD), "racy_since": since, "racy_until": until, **_STATUS}


def classify_scan(conn: psycopg.Connection, source: str,
                  racy: tuple[datetime, datetime] | None = None) -> dict[str, int]:
    """Classify every document the staged scan adds or changes, changing nothing, into the temporary tables
    scan_new (doc_id, held) and scan_changes (the staged file, its stored status and labels, and `change`:
    hold, changed (its file: parsed again), released (held before, admissible now), retitled (what a sidecar says it
    is), relabelled (labels only) or metadata (nothing the index holds); `relabelled` (labels change, whatever else
    does) and `newly_held`). Returns how many documents each of CLASSIFIED has. A file modified within `racy`
    (since, until: while the scan that stored it ran) is changed whatever its fingerprint says (rewritten within
    one tick of the file system's clock, its size, time and inode can stay the same). apply_scan applies it; a
    refresh's preview (stages.preview) reports it."""
    params = _racy_params(source, racy)
    conn.execute("""CREATE TEMP TABLE scan_new ON COMMIT DROP AS
                    SELECT s.doc_id, s.hold_status IS NOT NULL AS held FROM scan_files s
                    WHERE NOT EXISTS (SELECT 1 FROM documents d WHERE d.doc_id = s.doc_id)""")
    # Classify every existing document whose file, metadata or hold differs from what is stored. Another file
    # (inode) under the same name is a change even with the same size and time; a row without an identity (from
    # the release before identities) only gains one.
    conn.execute(
        """CREATE TEMP TABLE scan_changes ON COMMIT DROP AS
           SELECT c.*,
                  -- Labels change on the rows at once, whatever else changed: a narrowed ACL must not wait for
                  -- re-parsing (which may fail, or run later) to take effect.
                  c.change <> 'hold' AND c.acl_labels <> c.old_labels AS relabelled,
                  c.change = 'hold' AND NOT c.old_status = ANY(%(held)s) AS newly_held
           FROM (
           SELECT s.*, d.status AS old_status, d.acl_labels AS old_labels,
                  (d.fingerprint <> s.fingerprint OR d.file_id IS DISTINCT FROM s.file_id OR s.racy) AS file_changed,
                  CASE WHEN s.hold_status IS NOT NULL THEN 'hold'
                       WHEN d.fingerprint <> s.fingerprint OR d.file_id <> s.file_id
                            OR (d.file_id IS NOT NULL AND d.read_path IS DISTINCT FROM s.read_path)
                            OR s.racy THEN 'changed'
                       WHEN d.status = ANY(%(held)s) THEN 'released'
                       -- what a sidecar says the document is (title, organisation, kind, period) is in its prefixes
                       WHEN d.title IS DISTINCT FROM s.title
                            OR rag.document_identity(NULL, d.metadata, '{}') <> rag.document_identity(NULL, s.metadata, '{}')
                            THEN 'retitled'
                       WHEN d.acl_labels <> s.acl_labels THEN 'relabelled'
                       ELSE 'metadata' END AS change
           FROM (SELECT *,
                        -- Racily clean (see apply_scan); a file system that keeps whole seconds: in that second.
                        -- Not after the window: a time in the future would count as racy at every scan.
                        coalesce((modified_at >= %(racy_since)s::timestamptz
                                  OR (modified_at = date_trunc('second', modified_at)
                                      AND modified_at >= date_trunc('second', %(racy_since)s::timestamptz)))
                                 AND modified_at <= %(racy_until)s::timestamptz,
                                 false) AS racy
                 FROM scan_files) s JOIN documents d USING (doc_id)
           WHERE d.fingerprint <> s.fingerprint OR d.acl_labels <> s.acl_labels OR s.racy
              OR d.file_id IS DISTINCT FROM s.file_id OR d.file_links IS DISTINCT FROM s.file_links
              OR d.read_path IS DISTINCT FROM s.read_path
              OR d.title IS DISTINCT FROM s.title OR d.metadata <> s.metadata
              OR s.hold_status IS DISTINCT FROM (CASE WHEN d.status = ANY(%(held)s) THEN d.status END)
              OR d.held_reason IS DISTINCT FROM s.hold_reason) c""",
        params,
    )
    new, new_held = conn.execute("SELECT count(*), count(*) FILTER (WHERE held) FROM scan_new").fetchone()
    changed, released, retitled, relabelled, held = conn.execute(
        """SELECT count(*) FILTER (WHERE change = 'changed'), count(*) FILTER (WHERE change = 'released'),
                  count(*) FILTER (WHERE change = 'retitled'), count(*) FILTER (WHERE relabelled),
                  count(*) FILTER (WHERE newly_held)
           FROM scan_changes""").fetchone()
    return {"new": new, "changed": changed, "released": released, "retitled": retitled,
            "relabelled": relabelled, "held": new_held + held}


def classified_documents(conn: psycopg.Connection, limit: int) -> dict[str, list[str]]:
    """The doc_ids of the first `limit` documents of each of CLASSIFIED (by doc_id): what a refresh names."""
    def first(query: str, *params: object) -> list[str]:
        return [r[0] for r in conn.execute(query + " ORDER BY doc_id LIMIT %s", (*params, limit))]

    named = {change: first("SELECT doc_id FROM scan_changes WHERE change = %s", change)
             for change in ("changed", "released", "retitled")}
    named["new"] = first("SELECT doc_id FROM scan_new")
    named["relabelled"] = first("SELECT doc_id FROM scan_changes WHERE relabelled")
    named["held"] = sorted(first("SELECT doc_id FROM scan_new WHERE held")
                           + first("SELECT doc_id FROM scan_changes WHERE newly_held"))[:limit]
    return named


@dataclass(frozen=True)
class ClassifiedDocument:
    """One document classify_scan added or changed, with what a refresh's preview reports of it."""

    change: str  # new, or scan_changes' change
    relabelled: bool
    newly_held: bool
    rel_path: str
    size_bytes: int
    hold_reason: str | None
    stored: StoredDocument | None  # None for a new document
    twin_ref: int | None  # the parsed document whose pages a new object takes (stage_twins)


def iter_classified(conn: psycopg.Connection, twins: bool) -> Iterator[ClassifiedDocument]:
    """Every document of classify_scan's tables, streamed, by path; with `twins`, stage_twins' table is read."""
    twin = (sql.SQL("(SELECT x.ref FROM scan_twins t JOIN documents x ON x.doc_id = t.old_id"
                    " WHERE t.new_id = n.doc_id)") if twins else sql.SQL("NULL::bigint"))
    query = sql.SQL(
        """SELECT * FROM (
               SELECT 'new' AS change, false AS relabelled, n.held, s.rel_path, s.size_bytes, s.hold_reason,
                      NULL, NULL::bigint, NULL, NULL, NULL::boolean, NULL::integer, NULL::bigint, NULL::bigint,
                      {twin} AS twin_ref
               FROM scan_new n JOIN scan_files s USING (doc_id)
               UNION ALL
               SELECT c.change, c.relabelled, c.newly_held, c.rel_path, c.size_bytes, c.hold_reason, {stored}, NULL
               FROM scan_changes c JOIN documents d USING (doc_id)) classified
           ORDER BY 4""").format(twin=twin, stored=_STORED)
    with conn.cursor(name="classified") as cursor:
        cursor.execute(query)
        for row in cursor:
            stored = StoredDocument(*row[6:14]) if row[6] is not None else None
            yield ClassifiedDocument(*row[:6], stored, row[14])


def queued(conn: psycopg.Connection, source: str) -> list[tuple[str, int, int, int]]:
    """(status, documents, bytes, pages known) of the source's documents that wait for parsing, chunking or
    indexing from before (an interrupted run, a change of parser or chunker) and that the staged scan, classified,
    leaves in that state: a document it changes, releases or holds is counted with its change."""
    return [tuple(row) for row in conn.execute(
        """SELECT status, count(*), coalesce(sum(size_bytes), 0), coalesce(sum(page_count), 0) FROM documents d
           WHERE source = %s AND status = ANY(%s)
             AND NOT EXISTS (SELECT 1 FROM scan_changes c WHERE c.doc_id = d.doc_id
                             AND c.change IN ('hold', 'changed', 'released'))
           GROUP BY status ORDER BY status""",
        (source, [D.PENDING_PARSE.value, D.PENDING_CHUNK.value, D.PENDING_INDEX.value]),
    ).fetchall()]


def apply_scan(conn: psycopg.Connection, source: str, counts: ReconcileCounts,
               racy: tuple[datetime, datetime] | None = None, named: int = 0) -> None:
    """Insert the new documents of the staged scan and apply every change classify_scan finds (counted into
    `counts`, the first `named` of each class named): changed files go back to parsing, relabelled ones get their
    labels on every index row at once, newly held ones lose everything served from them (their parsed pages stay,
    never served). Drops the staged scan."""
    params = _racy_params(source, racy)
    for change, number in classify_scan(conn, source, racy).items():
        setattr(counts, change, number)
    if named:
        counts.documents.update(classified_documents(conn, named))
    conn.execute(
        """INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at,
                                  acl_labels, title, metadata, status, held_reason, file_id, file_links, read_path)
           SELECT s.doc_id, %(source)s, s.rel_path, s.fingerprint, s.size_bytes, s.modified_at, s.acl_labels,
                  s.title, s.metadata, coalesce(s.hold_status, %(pending_parse)s), s.hold_reason,
                  s.file_id, s.file_links, s.read_path
           FROM scan_new n JOIN scan_files s USING (doc_id)""",
        params,
    )
    # A document that is held back now loses everything served from it, in this transaction (its pages stay,
    # never served, so a release re-chunks instead of re-parsing).
    holds = [r[0] for r in conn.execute("SELECT doc_id FROM scan_changes WHERE newly_held").fetchall()]
    if holds:
        delete_derived_rows(conn, holds, keep_pages=True)
    # Pages kept for a cheap release are those of the file judged before: a file that changed while (or as) it is
    # held loses them, so that its release parses the new bytes instead of serving the old ones under new labels.
    # An erased document back at its source keeps no text either: what was erased stays erased until re-admitted.
    stale = [r[0] for r in conn.execute(
        "SELECT doc_id FROM scan_changes WHERE change = 'hold' AND (file_changed OR hold_status = %s)",
        (DocumentStatus.HELD_ERASED.value,)).fetchall()]
    if stale:
        delete_derived_rows(conn, stale)
    conn.execute(
        """UPDATE documents d SET
               fingerprint = c.fingerprint, size_bytes = c.size_bytes, modified_at = c.modified_at,
               file_id = c.file_id, file_links = c.file_links, read_path = c.read_path,
               acl_labels = c.acl_labels, title = c.title, metadata = c.metadata, last_seen = now(),
               held_reason = c.hold_reason,
               status = CASE c.change
                   WHEN 'hold' THEN c.hold_status
                   WHEN 'changed' THEN %(pending_parse)s
                   WHEN 'released' THEN CASE WHEN d.content_hash IS NOT NULL THEN %(pending_chunk)s
                                             ELSE %(pending_parse)s END
                   WHEN 'retitled' THEN CASE WHEN d.status IN (%(indexed)s, %(pending_index)s)
                                             THEN %(pending_chunk)s ELSE d.status END
                   ELSE d.status END,
               changed_at = CASE WHEN c.change IN ('changed', 'released', 'retitled')
                                 THEN now() ELSE d.changed_at END
           FROM scan_changes c WHERE d.doc_id = c.doc_id""",
        params,
    )
    relabelled = [r[0] for r in conn.execute("SELECT doc_id FROM scan_changes WHERE relabelled").fetchall()]
    if relabelled:
        relabel_index_rows(conn, relabelled)
    for table in ("scan_changes", "scan_new", "scan_files"):
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))


def repair_groups(conn: psycopg.Connection, group_ids: Sequence[str]) -> None:
    """After occurrences of these groups disappeared: drop groups left empty, and send the documents that
    still hold an occurrence back to indexing, so a group whose row went with its owner gets a new one
    (from the embedding cache: nothing is re-embedded)."""
    if not group_ids:
        return
    groups.drop_empty(conn, group_ids)
    conn.execute(
        """UPDATE documents SET status = %s
           WHERE status = %s AND doc_id IN (SELECT doc_id FROM chunks WHERE group_id = ANY(%s))""",
        (D.PENDING_INDEX, D.INDEXED, list(group_ids)),
    )


def delete_derived_rows(conn: psycopg.Connection, doc_ids: Sequence[str], keep_pages: bool = False) -> None:
    """Remove every row derived from these documents (pages, chunks, all index versions) but the documents.
    With keep_pages, a held document keeps its parsed pages and LLM prefixes (never served): when it is released
    it is re-chunked from them, not parsed again (OCR, VLM and prefix calls are not paid twice)."""
    groups.lock_assignment(conn)
    touched_groups = [r[0] for r in conn.execute(
        "SELECT DISTINCT group_id FROM chunks WHERE doc_id = ANY(%s) AND group_id IS NOT NULL", (list(doc_ids),)
    ).fetchall()]
    remember_embedding_inputs(conn, doc_ids)
    for version in versions.index_versions(conn):
        versions.delete_rows_of(conn, version, doc_ids)
    conn.execute("DELETE FROM chunks WHERE doc_id = ANY(%s)", (list(doc_ids),))
    if keep_pages:
        conn.execute("UPDATE documents SET indexed_content_hash = NULL WHERE doc_id = ANY(%s)", (list(doc_ids),))
    else:
        conn.execute("DELETE FROM document_pages WHERE doc_id = ANY(%s)", (list(doc_ids),))
        conn.execute("DELETE FROM prefix_cache WHERE doc_id = ANY(%s)", (list(doc_ids),))
        conn.execute("DELETE FROM picture_descriptions WHERE doc_id = ANY(%s)", (list(doc_ids),))
        conn.execute(
            "UPDATE documents SET content_hash = NULL, indexed_content_hash = NULL WHERE doc_id = ANY(%s)",
            (list(doc_ids),),
        )
    repair_groups(conn, touched_groups)


def remember_embedding_inputs(conn: psycopg.Connection, doc_ids: Sequence[str]) -> None:
    """Record what the documents' embedding-cache entries are keyed by, before their chunks and index rows go:
    the entries outlive the rows (for a return, until gc), and erasure must still find them."""
    inputs = {(doc_id, ids.embedding_input_sha(f"{prefix}\n{text}" if prefix else text))
              for doc_id, prefix, text in conn.execute(
                  "SELECT doc_id, prefix, text FROM chunks WHERE doc_id = ANY(%s)", (list(doc_ids),)).fetchall()}
    for version in versions.index_versions(conn):
        inputs.update(versions.embedding_inputs_of(conn, version, doc_ids))
    if inputs:
        with conn.cursor() as cursor:
            cursor.executemany("INSERT INTO document_embedding_inputs (doc_id, input_sha) VALUES (%s, %s) "
                               "ON CONFLICT DO NOTHING", sorted(inputs))


def relabel_index_rows(conn: psycopg.Connection, doc_ids: Sequence[str]) -> None:
    """ACL-only change: copy the documents' labels onto their rows in every version at once (a narrowed
    ACL must not wait for anything), then regroup them: near-duplicate groups never span label sets.
    Regrouping takes vectors from the embedding cache, so nothing is re-embedded. Only an indexed document is
    queued here: one queued for parsing is regrouped when parsed (text unchanged, chunks in another label set's
    groups: chunked again, rag_pipeline.stages.parse), one queued for chunking gets new chunks anyway."""
    for version in versions.index_versions(conn):
        versions.copy_document_labels(conn, version, doc_ids)
    conn.execute(
        "UPDATE documents SET status = %s WHERE status = %s AND doc_id = ANY(%s)",
        (D.PENDING_INDEX, D.INDEXED, list(doc_ids)),
    )
