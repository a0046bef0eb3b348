"""Object-store sources against real servers on 127.0.0.1: SeaweedFS (S3), fake-gcs-server (GCS), Azurite (Azure
Blob). Every case runs the real ingest job (Dagster, the parse workers, PostgreSQL) or the real discover stage."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
from dagster import DagsterInstance

from rag_pipeline import store
from rag_pipeline.config import SourceConfig
from rag_pipeline.defs.runs import preview_ingest, run_ingest
from rag_pipeline.domain import ids
from rag_pipeline.sources.folders import ScanReport
from rag_pipeline.sources.object_stores import (
    SourceReadError,
    StoreCounters,
    download_judged,
    key_problem,
    metadata_labels,
    scan_objects,
)
from rag_pipeline.stages.discover import RACY_MARGIN, discover
from rag_pipeline_tests.object_servers import (
    AzuriteServer,
    FakeGcsServer,
    S3Identity,
    SeaweedS3Server,
)

# The pipeline reads with an identity that may only read and list; OUTSIDER may read another bucket only.
READER = S3Identity("reader", "reader-key", "reader-secret", ("Read", "List"))
OUTSIDER = S3Identity("outsider", "outsider-key", "outsider-secret", ("Read:elsewhere", "List:elsewhere"))


def doc(title: str, body: str) -> bytes:
    return f"# {title}\n\n{body}\n".encode()


TRAVEL = doc("Travel policy", "Economy class for flights under six hours. Receipts within thirty days.")
EXPENSES = doc("Expense claims", "Claims above five hundred euros need a director's approval before payment.")
LEAVE = doc("Parental leave", "Sixteen weeks of paid leave for every parent, taken within the first year.")


@pytest.fixture(scope="module")
def instance() -> Iterator[DagsterInstance]:
    with DagsterInstance.ephemeral() as ephemeral:
        yield ephemeral


@pytest.fixture(scope="module")
def s3(tmp_path_factory) -> Iterator[SeaweedS3Server]:
    with SeaweedS3Server(tmp_path_factory.mktemp("s3"), identities=(READER, OUTSIDER)) as server:
        yield server


@pytest.fixture(scope="module")
def gcs(tmp_path_factory) -> Iterator[FakeGcsServer]:
    with FakeGcsServer(tmp_path_factory.mktemp("gcs")) as server:
        yield server


@pytest.fixture(scope="module")
def azure(tmp_path_factory) -> Iterator[AzuriteServer]:
    with AzuriteServer(tmp_path_factory.mktemp("azure")) as server:
        yield server


SHARED_BUCKET = "shared-docs"


class Bucket:
    """A fresh prefix (in the server's shared bucket, or in a bucket of its own) on one of the servers, and the
    source entry that reads it. A bucket is a few volumes to SeaweedFS: tests share one unless they need their own."""

    def __init__(self, kind: str, server, identity: S3Identity | None = None, own_bucket: bool = False):
        self.kind, self.server = kind, server
        self.prefix = f"p{uuid.uuid4().hex[:10]}"
        self.name = f"b{uuid.uuid4().hex[:12]}" if own_bucket else SHARED_BUCKET
        if own_bucket:
            server.create_bucket(self.name)
        elif not getattr(server, "shared_bucket_made", False):
            server.create_bucket(self.name)
            server.shared_bucket_made = True
        # Variables set for the whole session (conftest.OBJECT_STORE_TEST_ENV): parse workers see them too.
        if kind == "s3":
            who = "OUTSIDER" if identity is OUTSIDER else "READER"
            self.entry = {"root": f"s3://{self.name}/{self.prefix}/", "endpoint_url": server.endpoint,
                          "allow_http": True, "region": server.region, "credentials_env": {
                              "access_key_id": f"TEST_S3_{who}_ID", "secret_access_key": f"TEST_S3_{who}_SECRET"}}
        elif kind == "gs":
            self.entry = {"root": f"gs://{self.name}/{self.prefix}/", "allow_http": True,
                          "endpoint_url": server.endpoint, "credentials_env": {"service_account_key": "TEST_GCS_KEY"}}
        else:
            self.entry = {"root": f"az://{self.name}/{self.prefix}/", "endpoint_url": server.endpoint,
                          "allow_http": True, "credentials_env": {"account_name": "TEST_AZURE_ACCOUNT",
                                                                  "account_key": "TEST_AZURE_KEY"}}

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> str:
        return self.server.put_object(self.name, f"{self.prefix}/{key}", data, metadata)

    def delete(self, key: str) -> None:
        self.server.delete_object(self.name, f"{self.prefix}/{key}")

    def source(self, **overrides) -> dict:
        return {"name": "bucket", "acl_labels": ["staff"], **self.entry, **overrides}

    def config(self, **overrides) -> SourceConfig:
        return SourceConfig(**self.source(**overrides))


@pytest.fixture
def bucket(request) -> Callable[..., Bucket]:
    def make(kind: str = "s3", identity: S3Identity | None = None, own_bucket: bool = False) -> Bucket:
        server = request.getfixturevalue({"s3": "s3", "gs": "gcs", "az": "azure"}[kind])
        return Bucket(kind, server, identity, own_bucket)

    return make


def _ingest(make_settings, instance, *sources: dict, **overrides) -> dict:
    summary = run_ingest(make_settings(list(sources), **overrides), instance=instance)
    assert summary["success"], summary.get("errors")
    return summary


def _documents(db_url: str) -> dict[str, tuple[str, list[str]]]:
    with psycopg.connect(db_url) as conn:
        return {path: (status, labels) for path, status, labels in conn.execute(
            "SELECT rel_path, status, acl_labels FROM documents WHERE source = 'bucket'").fetchall()}


def _indexed_text(db_url: str, rel_path: str) -> str:
    with psycopg.connect(db_url) as conn:
        table = store.versions.active_version(conn).table_name
        rows = conn.execute(psycopg.sql.SQL("SELECT text FROM {} WHERE doc_id = %s ORDER BY ordinal").format(
            psycopg.sql.Identifier(table)), (ids.doc_id("bucket", rel_path),)).fetchall()
    return "\n".join(row[0] for row in rows)


@pytest.mark.parametrize("kind", ["s3", "gs", "az"])
def test_new_changed_moved_relabelled_deleted_objects(kind, bucket, make_settings, instance, db_url):
    box = bucket(kind)
    box.put("hr/travel.md", TRAVEL)
    box.put("hr/expenses.md", EXPENSES)
    box.put("finance/leave.md", LEAVE)
    box.put("notes.txt.meta.json", b"{}")  # a sidecar of nothing: not a document
    first = _ingest(make_settings, instance, box.source())
    assert (first["documents_seen"], first["new"], first["parsed"]) == (3, 3, 3)
    assert first["objects_downloaded"] == 3 and first["bytes_downloaded"] == len(TRAVEL + EXPENSES + LEAVE)
    assert "Economy class" in _indexed_text(db_url, "hr/travel.md")

    noop = _ingest(make_settings, instance, box.source())
    assert (noop["unchanged"], noop["objects_downloaded"], noop["bytes_downloaded"]) == (3, 0, 0)

    # Changed content, a move (same bytes at a new key), a relabel through a sidecar.
    box.put("hr/travel.md", doc("Travel policy", "Business class for flights over eight hours."))
    box.put("archive/leave.md", LEAVE)
    box.delete("finance/leave.md")
    box.put("hr/expenses.md.meta.json", json.dumps({"acl_labels": ["finance"]}).encode())
    previewed = preview_ingest(make_settings([box.source()])).as_dict()
    second = _ingest(make_settings, instance, box.source())
    assert (second["changed"], second["new"], second["deleted"], second["relabelled"]) == (1, 1, 1, 1)
    assert {name: previewed["counts"][name] for name in ("changed", "new", "deleted", "relabelled", "adopted")} == {
        "changed": 1, "new": 1, "deleted": 1, "relabelled": 1, "adopted": second["per_source"]["bucket"]["adopted"]}
    assert previewed["work"]["documents_to_parse"] == second["objects_downloaded"]  # what the preview said
    # S3's and GCS's ETag is the content's digest: the move takes its twin's pages, only the changed object is
    # downloaded. Azure's ETag names a write, so there the moved blob is downloaded and parsed again.
    moved_downloads = 1 if kind == "az" else 0
    assert second["objects_downloaded"] == 1 + moved_downloads
    assert second["per_source"]["bucket"]["adopted"] == 1 - moved_downloads
    text = _indexed_text(db_url, "hr/travel.md")
    assert "Business class" in text and "Economy class" not in text
    assert "Sixteen weeks" in _indexed_text(db_url, "archive/leave.md")
    assert second["vectors_embedded"] == 1  # the changed one; the moved one's vector comes from the cache
    assert _indexed_text(db_url, "finance/leave.md") == ""
    documents = _documents(db_url)
    assert documents["hr/expenses.md"] == ("indexed", ["finance"])
    assert set(documents) == {"hr/travel.md", "hr/expenses.md", "archive/leave.md"}


def test_a_listing_that_fails_changes_nothing_and_an_empty_one_deletes_nothing(bucket, s3, make_settings,
                                                                                instance, db_url):
    box = bucket("s3")
    box.put("a.md", TRAVEL)
    box.put("b.md", EXPENSES)
    _ingest(make_settings, instance, box.source())
    before = _documents(db_url)

    # Access denied by the server's policy: this identity may read another bucket only.
    denied = bucket("s3", identity=OUTSIDER)
    denied_entry = {**box.source(), "credentials_env": denied.entry["credentials_env"]}
    summary = run_ingest(make_settings([denied_entry]), instance=instance)  # a failed scan fails the run
    assert not summary["success"] and summary["scans_failed"] == ["bucket"]
    assert any("scan failed, nothing of this source changed" in p["problem"] for p in summary["problems"])
    assert _documents(db_url) == before

    # A server that is down: the same, after the client's bounded retries.
    s3.kill()
    try:
        summary = run_ingest(make_settings([box.source(max_retries=1, request_timeout_seconds=5)]), instance=instance)
        assert not summary["success"] and any("scan failed" in p["problem"] for p in summary["problems"])
        assert _documents(db_url) == before
    finally:
        s3.start()

    # Every object gone: an emptied (or wrongly configured) prefix deletes nothing until confirmed.
    box.delete("a.md")
    box.delete("b.md")
    summary = _ingest(make_settings, instance, box.source())
    assert summary["deleted"] == 0 and summary["deletions_held"] == 2
    assert _documents(db_url) == before


def test_unreadable_or_ambiguous_sidecars_hold_what_they_speak_for(bucket, make_settings, instance, db_url):
    box = bucket("s3")
    box.put("open/a.md", TRAVEL)
    box.put("open/b.md", EXPENSES)
    box.put("open/b.md.meta.json", b'{"acl_labels": "hr, finance"}')  # a string: one label or two?
    box.put("closed/_meta.json", b"{not json")
    box.put("closed/deep/c.md", LEAVE)
    box.put("closed/deep/_meta.json", json.dumps({"acl_labels": ["everyone"]}).encode())  # cannot widen
    box.put("nobody.md", LEAVE)
    box.put("nobody.md.meta.json", json.dumps({"acl_labels": []}).encode())
    _ingest(make_settings, instance, box.source())
    documents = _documents(db_url)
    assert documents["open/a.md"] == ("indexed", ["staff"])
    assert documents["open/b.md"][0] == "held_bad_sidecar"
    assert documents["closed/deep/c.md"][0] == "held_bad_sidecar"
    assert documents["nobody.md"][0] == "held_no_labels"
    for held in ("open/b.md", "closed/deep/c.md", "nobody.md"):
        assert _indexed_text(db_url, held) == ""


def test_sidecars_listed_after_their_objects_still_decide(bucket, db_url, monkeypatch):
    # Objects are judged while the listing goes on; a store lists keys in byte order, so a folder's `_meta.json`
    # comes after `2024/...` and `Annual.md` in it, and `late.md.meta.json` after `late.md-2.md`. With batches of
    # two, those objects are judged before their sidecars are listed, and must be judged again.
    monkeypatch.setattr("rag_pipeline.sources.object_stores.BATCH", 2)
    box = bucket("s3")
    for key in ("docs/2024/q1.md", "docs/2024/q2.md", "docs/2024/q3.md", "docs/Annual.md", "docs/zeta.md",
                "late.md", "late.md-2.md", "late.md-3.md", "shut/A.md", "shut/B.md", "shut/C.md"):
        box.put(key, TRAVEL)
    box.put("docs/_meta.json", json.dumps({"acl_labels": ["finance"]}).encode())
    box.put("late.md.meta.json", json.dumps({"acl_labels": ["hr"]}).encode())
    box.put("shut/_meta.json", b"{broken")
    expected = {"docs/2024/q1.md": ("finance",), "docs/2024/q2.md": ("finance",), "docs/2024/q3.md": ("finance",),
                "docs/Annual.md": ("finance",), "docs/zeta.md": ("finance",), "late.md": ("hr",),
                "late.md-2.md": ("staff",), "late.md-3.md": ("staff",)}
    judged = list(scan_objects(box.config(), ScanReport()))
    assert {f.rel_path for f in judged if f.rejudged} >= {"docs/2024/q1.md", "late.md", "shut/A.md"}
    final = {f.rel_path: f for f in judged}  # a second judgment comes after the first
    assert {path: f.acl_labels for path, f in final.items() if not f.held} == expected
    assert {path for path, f in final.items() if f.held} == {"shut/A.md", "shut/B.md", "shut/C.md"}

    stats = discover(db_url, [box.config()])
    assert (stats.documents_seen, stats.new, stats.problems) == (11, 11, [])
    documents = _documents(db_url)
    assert {path: tuple(labels) for path, (status, labels) in documents.items() if status == "pending_parse"} == expected
    assert {documents[f"shut/{name}.md"][0] for name in "ABC"} == {"held_bad_sidecar"}


@pytest.mark.parametrize("kind", ["s3", "gs", "az"])
def test_labels_from_object_metadata(kind, bucket, db_url, make_settings, instance):
    box = bucket(kind)
    box.put("a.md", TRAVEL, metadata={"acl_labels": '["hr", "exec"]'})
    box.put("b.md", EXPENSES)  # no labels in its metadata: the source's
    box.put("c.md", LEAVE, metadata={"acl_labels": "hr, exec"})  # not a JSON list: ambiguous
    box.put("d.md", LEAVE, metadata={"acl_labels": '["hr"]'})
    box.put("d.md.meta.json", json.dumps({"acl_labels": ["staff"]}).encode())  # two places say who reads
    source = box.source(labels_from="metadata")
    time.sleep(RACY_MARGIN.total_seconds() + 1)  # else the scan after the first finds them racily clean: read again
    first = _ingest(make_settings, instance, source)
    documents = _documents(db_url)
    assert documents["a.md"] == ("indexed", ["hr", "exec"])
    assert documents["b.md"] == ("indexed", ["staff"])
    assert documents["c.md"][0] == documents["d.md"][0] == "held_bad_sidecar"
    assert first["per_source"]["bucket"]["metadata_reads"] == 4

    # Unchanged objects keep their labels without a metadata read; a rewrite with new metadata relabels.
    second = _ingest(make_settings, instance, source)
    assert second["per_source"]["bucket"]["metadata_reads"] == 2  # only the two held ones are read again
    box.put("a.md", TRAVEL, metadata={"acl_labels": '["exec"]'})
    third = _ingest(make_settings, instance, source)
    assert _documents(db_url)["a.md"] == ("indexed", ["exec"])
    assert third["vectors_embedded"] == 0  # same bytes: labels changed on the rows, nothing re-embedded

    # New default labels: the labels stored with unchanged objects may be old defaults, so all are read again.
    fourth = _ingest(make_settings, instance, {**source, "acl_labels": ["everyone"]})
    assert fourth["per_source"]["bucket"]["metadata_reads"] == 4
    assert _documents(db_url)["b.md"] == ("indexed", ["everyone"])
    assert _documents(db_url)["a.md"] == ("indexed", ["exec"])


@pytest.mark.parametrize("versioned", [False, True], ids=["unversioned", "versioned"])
def test_the_version_listed_is_the_version_read(versioned, bucket, s3, make_settings, instance, db_url):
    box = bucket("s3", own_bucket=versioned)
    if versioned:
        s3.enable_versioning(box.name)
    box.put("a.md", TRAVEL)
    settings = make_settings([box.source()])
    stats = discover(db_url, settings.sources)
    assert stats.new == 1
    # A newer version lands between the scan and the download: the scan's labels were for the old one.
    box.put("a.md", doc("Travel policy", "Replaced after the scan."))
    summary = run_ingest(settings, instance=instance)
    assert summary["success"]
    assert "Replaced after the scan" in _indexed_text(db_url, "a.md")  # the run's own scan saw the new one

    config = box.config()
    with psycopg.connect(db_url) as conn:
        file_id = conn.execute("SELECT file_id FROM documents WHERE doc_id = %s",
                               (ids.doc_id("bucket", "a.md"),)).fetchone()[0]
    box.put("a.md", doc("Travel policy", "A third version."))
    with pytest.raises(Exception) as raised:
        download_judged(config, "a.md", file_id, 10**6, Path(s3.workdir) / "never.md")
    assert type(raised.value).__name__ == "ChangedSinceScanError"


def test_a_file_changed_while_held_is_parsed_again_on_release(bucket, make_settings, instance, db_url):
    box = bucket("s3")
    box.put("a.md", TRAVEL)
    _ingest(make_settings, instance, box.source())
    # New bytes and a sidecar that cannot be read, in one scan: held, and the old pages must not be its release.
    box.put("a.md", doc("Travel policy", "Rewritten while held."))
    box.put("a.md.meta.json", b"{broken")
    _ingest(make_settings, instance, box.source())
    assert _documents(db_url)["a.md"][0] == "held_bad_sidecar"
    box.delete("a.md.meta.json")
    released = _ingest(make_settings, instance, box.source())
    assert released["objects_downloaded"] == 1 and released["parsed"] == 1
    text = _indexed_text(db_url, "a.md")
    assert "Rewritten while held" in text and "Economy class" not in text


def test_a_metadata_copy_that_relabels_moves_the_chunks_and_survives_an_index_build(bucket, s3, make_settings,
                                                                                   instance, db):
    """Issue 47, case 2: an S3 copy in place with new `acl_labels` metadata (same bytes, same ETag) changed the
    document's labels but left its chunk in the old label set's near-duplicate group; the same text under the old
    labels was then invisible to its readers, and an index build left the active version broken."""
    import time

    from rag_pipeline.defs.runs import run_index_build
    from rag_pipeline.embedding.locations import resolve_model
    from rag_pipeline.lifecycle import blue_green, checks
    from rag_pipeline.retrieval.search import search
    from rag_pipeline.text import dedup

    def group_keys(rel_path: str) -> set[str]:
        return {r[0] for r in db.execute(
            """SELECT g.acl_key FROM chunks c JOIN documents d USING (doc_id)
               LEFT JOIN chunk_groups g ON g.group_id = c.group_id WHERE d.rel_path = %s""", (rel_path,))}

    def readers_find(labels: list[str]) -> set[str]:
        return {hit.path for hit in search(db, "how long is the travel receipt kept", labels, k=10, mode="hybrid")}

    def ingest() -> dict:
        summary = run_ingest(settings, instance=instance)
        assert summary["success"], summary.get("errors")
        return summary

    box = bucket("s3")
    box.put("a.md", TRAVEL, metadata={"acl_labels": '["staff"]'})
    settings = make_settings([box.source(labels_from="metadata")])
    ingest()
    assert group_keys("a.md") == {dedup.acl_key(["staff"])}
    time.sleep(1.1)  # a listing time of another second (the same second is case 1's)
    key = f"{box.prefix}/a.md"
    s3.admin().copy_object(Bucket=box.name, Key=key, CopySource={"Bucket": box.name, "Key": key},
                           Metadata={"acl_labels": '["hr"]'}, MetadataDirective="REPLACE")
    relabelled = ingest()
    assert relabelled["vectors_embedded"] == 0
    assert group_keys("a.md") == {dedup.acl_key(["hr"])}
    box.put("b.md", TRAVEL, metadata={"acl_labels": '["staff"]'})  # the same text under the old labels
    ingest()
    assert group_keys("b.md") == {dedup.acl_key(["staff"])}

    build = run_index_build(settings, resolve_model("all-MiniLM-L6-v2").location, instance=instance)
    assert build["success"] and build["status"] == "ready", build
    outcomes = {"index_drift": checks.index_drift(db), "acl_coverage": checks.acl_coverage(db),
                "deletion_replay": checks.deletion_replay(db)}
    assert all(o.passed for o in outcomes.values()), {name: o.summary for name, o in outcomes.items()}
    assert readers_find(["staff"]) == {"b.md"} and readers_find(["hr"]) == {"a.md"}
    v2 = store.versions.get_version(db, build["version"])
    with db.transaction():
        blue_green.promote(db, v2.version_id, blue_green.check_gates(db, v2))
    assert readers_find(["staff"]) == {"b.md"} and readers_find(["hr"]) == {"a.md"}
    assert all(ingest()["checks"][name]["passed"] for name in ("index_drift", "acl_coverage", "deletion_replay"))


def test_moving_every_object_is_held_by_the_deletion_guard(bucket, db_url):
    box = bucket("s3")
    box.put("a.md", TRAVEL)
    box.put("b.md", EXPENSES)
    assert discover(db_url, [box.config()]).new == 2
    for name, body in (("a.md", TRAVEL), ("b.md", EXPENSES)):
        box.put(f"moved/{name}", body)
        box.delete(name)
    stats = discover(db_url, [box.config()])
    assert stats.deleted == 0 and stats.deletions_held == 2


def test_unsafe_keys_are_refused_and_nothing_escapes_the_prefix(bucket, db_url):
    assert key_problem("a/../b.md") and key_problem("./b.md") and key_problem("a//b.md")
    assert key_problem("/b.md") and key_problem("a/b\x01.md") and key_problem("x" * 1025)
    assert key_problem("reports/2024 Q1 (final).pdf") is None
    # fake-gcs-server keeps a control character in a key (the client lists it as U+FFFD): refused, the rest read.
    box = bucket("gs")
    box.put("ok.md", TRAVEL)
    box.put("c\x01d.md", LEAVE)
    report = ScanReport()
    assert [f.rel_path for f in scan_objects(box.config(), report)] == ["ok.md"]
    assert ["control characters" in p.problem for p in report.problems] == [True]

    # Azurite keeps 'a//b.md' as written, and the client refuses to list it: the scan fails, naming the key, and
    # changes nothing (never a listing with a hole in it, which would read as deletions).
    box = bucket("az")
    box.put("ok.md", TRAVEL)
    first = discover(db_url, [box.config()])
    assert first.new == 1
    box.put("a//b.md", EXPENSES)
    box.delete("ok.md")
    stats = discover(db_url, [box.config()])
    assert stats.deleted == 0 and stats.new == 0
    assert any("scan failed" in p["problem"] and "a//b.md" in p["problem"] for p in stats.problems)


def test_metadata_labels_are_a_json_list_or_nothing():
    assert metadata_labels({"Acl_Labels": '["a", "b", "a"]'}, "acl_labels", "k") == ("a", "b")
    assert metadata_labels({"Content-Type": "text/plain"}, "acl_labels", "k") is None
    for bad in ('"a"', "a,b", '[""]', '[1]', '{"a": 1}', "["):
        with pytest.raises(ValueError):
            metadata_labels({"acl_labels": bad}, "acl_labels", "k")
    with pytest.raises(ValueError):  # two spellings of one key: which one?
        metadata_labels({"acl_labels": '["a"]', "ACL_LABELS": '["b"]'}, "acl_labels", "k")
    for near_miss in ("acl-labels", "labels", "x-acl"):  # would leave the source's wider default labels
        with pytest.raises(ValueError):
            metadata_labels({near_miss: '["a"]'}, "acl_labels", "k")


class CuttingProxy:
    """An HTTP proxy in front of a server that can cut a GET's body half-way (`cut_downloads` times), or run a hook
    before forwarding the n-th listing request (a server killed mid-listing)."""

    def __init__(self, target: str):
        self.target = target.removeprefix("http://")
        self.cut_downloads = 0
        self.cut_fraction = 0.5  # of each cut body, sent before the connection drops
        self.on_listing: Callable[[int], None] | None = None
        self.listings = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if "list-type=2" in self.path:
                    proxy.listings += 1
                    if proxy.on_listing:
                        proxy.on_listing(proxy.listings)
                upstream = http.client.HTTPConnection(proxy.target, timeout=30)
                try:
                    upstream.request(self.command, self.path, body, dict(self.headers))
                    answer = upstream.getresponse()
                except OSError:
                    self.send_error(502)
                    return
                data = answer.read()
                cut = self.command == "GET" and answer.status in (200, 206) and "list-type" not in self.path \
                    and not self.path.endswith(".meta.json") and proxy.cut_downloads > 0 and len(data) > 8
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection"):
                        self.send_header(name, value)
                self.end_headers()
                if cut:
                    proxy.cut_downloads -= 1
                    self.wfile.write(data[: int(len(data) * proxy.cut_fraction)])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                self.wfile.write(data)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def test_a_download_cut_off_is_retried_and_never_indexed_half(bucket, s3, tmp_path):
    box = bucket("s3")
    body = doc("Travel policy", "x" * 50_000)
    etag = box.put("a.md", body)
    proxy = CuttingProxy(s3.endpoint)
    try:
        config = box.config(endpoint_url=proxy.endpoint, max_retries=2)
        target = tmp_path / "a.md"
        proxy.cut_downloads = 1
        counters = StoreCounters()
        download_judged(config, "a.md", f"etag:{etag}", len(body), target, counters)
        assert target.read_bytes() == body  # the second attempt, whole

        # The client resumes a cut body from where it stopped (a range request), then this module retries whole:
        # four cuts (more than the client's two retries) still end with the whole object.
        proxy.cut_downloads = 4
        download_judged(config, "a.md", f"etag:{etag}", len(body), target, counters)
        assert target.read_bytes() == body

        # A body that never arrives: an error after the retries, never a half file taken for the object.
        proxy.cut_downloads, proxy.cut_fraction = 1000, 0.0
        with pytest.raises(SourceReadError):
            download_judged(config, "a.md", f"etag:{etag}", len(body), target)
    finally:
        proxy.close()


def test_a_server_killed_mid_listing_changes_nothing(bucket, s3, make_settings, instance, db_url):
    box = bucket("s3")
    admin = s3.admin()  # one client for the 1,202 objects of two listing pages (a client each is most of the time)
    for number in range(1, 1203):
        admin.put_object(Bucket=box.name, Key=f"{box.prefix}/many/{number:04d}.txt", Body=f"note {number}".encode())
    settings = make_settings([box.source(include=["*.txt"])])
    first = discover(db_url, settings.sources)
    assert first.new == 1202
    proxy = CuttingProxy(s3.endpoint)

    def kill_on_second_page(listing: int) -> None:
        if listing == 2:
            s3.kill()

    proxy.on_listing = kill_on_second_page
    try:
        box.delete("many/0001.txt")
        config = box.config(include=["*.txt"], endpoint_url=proxy.endpoint, max_retries=1,
                            request_timeout_seconds=5)
        stats = discover(db_url, [config])
        assert stats.deleted == 0 and stats.new == 0
        assert any("scan failed" in p["problem"] for p in stats.problems)
        assert len(_documents(db_url)) == 1202
    finally:
        proxy.close()
        s3.start()


def test_the_sensor_launches_on_a_listing_change_only(bucket, s3, make_settings, instance):
    import dagster as dg

    from rag_pipeline.defs.code_location import build_definitions
    from rag_pipeline.defs.resources import RagResource

    box = bucket("s3")
    box.put("a.md", TRAVEL)
    settings = make_settings([box.source(max_retries=1)])
    sensor = build_definitions(settings).resolve_sensor_def("source_changes")

    def tick(cursor):
        context = dg.build_sensor_context(instance=instance, cursor=cursor, resources={"rag": RagResource(settings)})
        return sensor.evaluate_tick(context)

    first = tick(None)
    assert len(first.run_requests) == 1
    assert tick(first.cursor).run_requests == []  # one listing, nothing changed: no run
    box.put("a.md.meta.json", json.dumps({"acl_labels": ["hr"]}).encode())  # a sidecar is a change
    relabelled = tick(first.cursor)
    assert len(relabelled.run_requests) == 1
    box.put("a.md", EXPENSES)
    assert len(tick(relabelled.cursor).run_requests) == 1
    # A store that cannot be listed is not a change: no run into a scan that would fail.
    s3.kill()
    try:
        assert tick(relabelled.cursor).run_requests == []
    finally:
        s3.start()


def test_credentials_from_an_aws_profile(bucket, db_url, tmp_path, monkeypatch):
    # The profiles file as `aws configure` writes it; boto3 reads it, obstore signs with what it gives.
    credentials = tmp_path / "credentials"
    credentials.write_text(f"[reader]\naws_access_key_id = {READER.access_key}\naws_secret_access_key = "
                           f"{READER.secret_key}\n[outsider]\naws_access_key_id = {OUTSIDER.access_key}\n"
                           f"aws_secret_access_key = {OUTSIDER.secret_key}\n")
    (tmp_path / "config").write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    box = bucket("s3")
    box.put("a.md", TRAVEL)
    box.put("b.md", LEAVE)
    entry = {key: value for key, value in box.source().items() if key != "credentials_env"}

    assert discover(db_url, [SourceConfig(**entry, aws_profile="reader")]).new == 2
    listed = next(f for f in scan_objects(SourceConfig(**entry, aws_profile="reader"), ScanReport())
                  if f.rel_path == "a.md")
    download_judged(SourceConfig(**entry, aws_profile="reader"), "a.md", listed.file_id, listed.size_bytes,
                    tmp_path / "a.md")
    assert (tmp_path / "a.md").read_bytes() == TRAVEL

    box.delete("a.md")  # a profile that may not list this bucket: the scan fails and deletes nothing
    denied = discover(db_url, [SourceConfig(**entry, aws_profile="outsider")])
    assert denied.deleted == 0 and any("scan failed" in p["problem"] for p in denied.problems)
    missing = discover(db_url, [SourceConfig(**entry, aws_profile="nobody")])
    assert any("'nobody'" in p["problem"] for p in missing.problems) and missing.deleted == 0

    # As in the AWS SDKs, keys in the environment come before AWS_PROFILE (here the outsider's: denied)...
    monkeypatch.setenv("AWS_PROFILE", "reader")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", OUTSIDER.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", OUTSIDER.secret_key)
    assert any("scan failed" in p["problem"] for p in discover(db_url, [SourceConfig(**entry)]).problems)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    # ...and without them the variable names the profile when the source does not.
    with monkeypatch.context() as without_boto3:  # never another identity in its place: the scan fails
        without_boto3.setitem(sys.modules, "boto3", None)
        without_boto3.setattr("rag_pipeline.sources.object_stores._PROFILE_PROVIDERS", {})  # none built yet
        refused = discover(db_url, [SourceConfig(**entry)])
        assert refused.deleted == 0 and any("[aws]" in p["problem"] for p in refused.problems)
    assert discover(db_url, [SourceConfig(**entry)]).deleted == 1


def test_object_store_configuration_is_refused_with_the_key(tmp_path):
    from pydantic import ValidationError

    for entry, key in [
        ({"root": "s3://docs/x/", "symlinks": "refuse"}, "symlinks"),
        ({"root": str(tmp_path), "endpoint_url": "http://127.0.0.1:1"}, "endpoint_url"),
        ({"root": "s3://docs/x/", "endpoint_url": "http://127.0.0.1:1"}, "allow_http"),
        ({"root": "s3://docs/x/", "credentials_env": {"secret_access_key": "wJalrXUtnFEMI/K7MDENG"}}, "credentials_env"),
        ({"root": "gs://docs/x/", "credentials_env": {"access_key_id": "X"}}, "credentials_env.access_key_id"),
        ({"root": "s3://docs/../x/"}, "root"),
        ({"root": "ftp://docs/x/"}, "root"),
        ({"root": "gs://docs/x/", "aws_profile": "reader"}, "aws_profile"),
        ({"root": "s3://docs/x/", "aws_profile": "reader", "credentials_env": {"access_key_id": "K"}}, "aws_profile"),
    ]:
        with pytest.raises(ValidationError) as refused:
            SourceConfig(name="s", **entry)
        assert key in str(refused.value), (entry, str(refused.value))
    assert SourceConfig.from_cli("s=s3://docs/x/").store_scheme == "s3"


def test_a_command_line_object_store_source_is_registered_with_its_url(db):
    given = SourceConfig.from_cli("cli=gs://docs/team/", ("staff",))
    store.sources.upsert_source(db, given, "command_line")
    (registered,) = store.sources.registered_sources(db, "command_line")
    assert registered.root == "gs://docs/team/" and registered.store_scheme == "gs"
    assert registered.acl_labels == ("staff",)


def test_content_encoded_objects_are_decoded_within_the_size_cap_or_dead_lettered(bucket, s3, make_settings,
                                                                                 instance, db_url):
    """An object stored with `Content-Encoding: gzip` (or deflate) is parsed as its type, not as compressed bytes;
    its decoded size counts against parsing.max_file_bytes (a gzip bomb is too_large); a coding not decoded, or a
    body that is not what its coding says, is dead-lettered naming it (issue 47, case 9)."""
    import gzip
    import zlib

    box = bucket("s3")

    def put(key: str, data: bytes, encoding: str) -> None:
        s3.admin().put_object(Bucket=box.name, Key=f"{box.prefix}/{key}", Body=data, ContentEncoding=encoding,
                              ContentType="text/markdown")

    put("gzipped.md", gzip.compress(TRAVEL), "gzip")
    put("deflated.md", zlib.compress(EXPENSES), "deflate")
    bomb = gzip.compress(b"# Bomb\n\n" + b"a" * 4_000_000)  # 4 MB of text in 4 KB
    put("bomb.md", bomb, "gzip")
    put("brotli.md", LEAVE, "br")
    put("lying.md", LEAVE, "gzip")  # says gzip, is not
    box.put("plain.md", LEAVE)
    summary = _ingest(make_settings, instance, box.source(), parsing={"max_file_bytes": 1_000_000})
    assert len(bomb) < 1_000_000 and summary["bytes_downloaded"] < 1_000_000  # only the encoded bytes travel
    assert "Economy class for flights under six hours" in _indexed_text(db_url, "gzipped.md")
    assert "need a director's approval" in _indexed_text(db_url, "deflated.md")
    assert "Sixteen weeks" in _indexed_text(db_url, "plain.md")
    with psycopg.connect(db_url) as conn:
        dead = {path: (reason, detail) for path, reason, detail in conn.execute(
            "SELECT d.rel_path, l.reason, l.detail FROM dead_letters l JOIN documents d USING (doc_id)").fetchall()}
    assert set(dead) == {"bomb.md", "brotli.md", "lying.md"}
    assert dead["bomb.md"][0] == "too_large" and "parsing.max_file_bytes is 1,000,000" in dead["bomb.md"][1]
    assert dead["brotli.md"][0] == "unsupported" and "Content-Encoding 'br'" in dead["brotli.md"][1]
    assert dead["lying.md"][0] == "corrupt" and "gzip" in dead["lying.md"][1]
    for path in dead:
        assert _indexed_text(db_url, path) == ""


def _at_the_start_of_a_second() -> None:
    time.sleep(1.02 - time.time() % 1)


def test_a_relabel_by_metadata_copy_in_the_second_the_scan_listed_is_seen(bucket, s3, db_url):
    """Issue 47, case 1: listing times have one-second resolution and a metadata copy keeps the ETag, so an object
    copied in place with new labels in the second the last scan listed it has the fingerprint that scan stored.
    Deterministic: the test retries until the copy has exactly the listed time and ETag of the put, and the scan
    started in that same second (a rule comparing full-precision times would call the object clean)."""
    box = bucket("s3")
    admin = s3.admin()
    config = box.config(labels_from="metadata")
    for attempt in range(6):
        key = f"a{attempt}.md"
        _at_the_start_of_a_second()
        box.put(key, TRAVEL, metadata={"acl_labels": '["staff"]'})
        put = admin.head_object(Bucket=box.name, Key=f"{box.prefix}/{key}")
        discover(db_url, [config])
        admin.copy_object(Bucket=box.name, Key=f"{box.prefix}/{key}", MetadataDirective="REPLACE",
                          CopySource={"Bucket": box.name, "Key": f"{box.prefix}/{key}"},
                          Metadata={"acl_labels": '["hr"]'})
        copied = admin.head_object(Bucket=box.name, Key=f"{box.prefix}/{key}")
        with psycopg.connect(db_url) as conn:
            started = conn.execute("SELECT last_scan_started_at FROM sources WHERE name = 'bucket'").fetchone()[0]
        if (copied["LastModified"], copied["ETag"]) == (put["LastModified"], put["ETag"]) \
                and started.replace(microsecond=0) == put["LastModified"]:
            break
    else:
        pytest.fail("could not put, scan and copy within one second in 6 tries")
    assert copied["Metadata"] == {"acl_labels": '["hr"]'} and _documents(db_url)[key] == ("pending_parse", ["staff"])
    time.sleep(RACY_MARGIN.total_seconds() + 1)  # so that the scan after this one finds every object clean
    stats = discover(db_url, [config])
    assert stats.relabelled == 1 and stats.per_source["bucket"]["metadata_reads"] >= 1
    assert _documents(db_url)[key] == ("pending_parse", ["hr"])
    # This scan started well after every write: the objects are clean now, their labels are taken as stored.
    assert discover(db_url, [config]).per_source["bucket"]["metadata_reads"] == 0


def test_a_source_that_cannot_be_scanned_fails_the_run_and_staleness_at_once(bucket, make_settings, db_url,
                                                                             tmp_path, monkeypatch, capsys):
    """Issue 47, case 5: a scan that fails (here the credentials are missing from the environment, as in a daemon
    started without them) fails the run and `ingest` exits 1, once the other sources are scanned and indexed, and
    `staleness` fails for that source at once with severity ERROR; the next scan that completes clears it."""
    from rag_pipeline.cli import main
    from rag_pipeline.lifecycle import checks

    for name in ("DAGSTER_HOME", "RAG_DAGSTER_POSTGRES_URL"):  # the CLI sets them in os.environ: undone afterwards
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    box = bucket("s3")
    box.put("a.md", TRAVEL)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "one.md").write_text("# One\n\nThe first note of the folder.\n")
    settings = make_settings([box.source(), {"name": "folder", "root": str(folder), "acl_labels": ["staff"]}])
    ingest = ["--config", str(settings.config_file), "ingest", "--json"]
    assert main(ingest) == 0
    capsys.readouterr()

    secret = os.environ["TEST_S3_READER_SECRET"]
    monkeypatch.delenv("TEST_S3_READER_SECRET")
    (folder / "two.md").write_text("# Two\n\nThe second note of the folder.\n")
    assert main(ingest) == 1
    summary = json.loads(capsys.readouterr().out)
    assert not summary["success"] and summary["scans_failed"] == ["bucket"]
    assert summary["new"] == 1 and summary["parsed"] == 1  # the folder was scanned and indexed all the same
    assert any(p["source"] == "bucket" and "scan failed" in p["problem"] and "TEST_S3_READER_SECRET" in p["problem"]
               for p in summary["problems"])
    staleness = summary["checks"]["staleness"]
    assert not staleness["passed"] and staleness["severity"] == "ERROR"
    assert "bucket: its latest scan failed" in staleness["summary"] and "TEST_S3_READER_SECRET" in staleness["summary"]
    with psycopg.connect(db_url) as conn:
        outcome = checks.staleness(conn, settings.sources)
    assert not outcome.passed and outcome.error and "bucket" in outcome.summary and "folder" not in outcome.summary

    monkeypatch.setenv("TEST_S3_READER_SECRET", secret)
    assert main(ingest) == 0
    assert json.loads(capsys.readouterr().out)["checks"]["staleness"]["passed"]
