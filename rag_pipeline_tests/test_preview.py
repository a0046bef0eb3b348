"""`ingest --dry-run` and the preview_refresh job: what a refresh would do, on the real database and Dagster,
checked against what the refresh then does, with the index database dumped before and after the preview."""

import json

import psycopg
import pytest
from dagster import DagsterInstance

from rag_pipeline import cli, store
from rag_pipeline.config import ConfigError
from rag_pipeline.defs.code_location import build_definitions
from rag_pipeline.defs.runs import preview_ingest, run_ingest
from rag_pipeline.stages.discover import CHANGE_CLASSES
from rag_pipeline_tests.conftest import pg_dump

PARAGRAPH = ("The {name} procedure covers who signs off on {topic}, how long records are kept, and which team "
             "answers questions about it. Records of {topic} are kept for {years} years after the last change.\n\n")


def _write(root, name: str, topic: str, years: int = 7) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# {topic.title()}\n\n" + PARAGRAPH.format(name=name, topic=topic, years=years) * 3)


def _sidecar(root, name: str, meta: dict) -> None:
    (root / f"{name}.meta.json").write_text(json.dumps(meta))


@pytest.fixture
def every_change(tmp_path, make_settings):
    """A source indexed once, then changed in every way a refresh tells apart."""
    root = tmp_path / "docs"
    for name, topic in [("keep.md", "badges"), ("change.md", "travel"), ("relabel.md", "payroll"),
                        ("hold.md", "visitors"), ("gone.md", "parking"), ("release.md", "laptops"),
                        ("retitle.md", "printing"), ("move.md", "lockers")]:
        _write(root, name, topic)
    _sidecar(root, "release.md", {"acl_labels": []})  # held at first: nobody may read it
    _sidecar(root, "retitle.md", {"title": "Printing (draft)"})
    settings = make_settings([{"name": "docs", "root": str(root), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        first = run_ingest(settings, instance=instance)
        assert first["success"], first.get("errors")
        _write(root, "change.md", "travel", years=10)  # new bytes
        _sidecar(root, "relabel.md", {"acl_labels": ["hr"]})
        _sidecar(root, "hold.md", {"acl_labels": []})
        (root / "gone.md").unlink()
        (root / "release.md.meta.json").unlink()
        _sidecar(root, "retitle.md", {"title": "Printing"})
        (root / "moved").mkdir()
        (root / "move.md").rename(root / "moved" / "move.md")  # a folder keeps no ETag: new here, deleted there
        _write(root, "new.md", "canteen")
        _write(root, "new_held.md", "archives")
        _sidecar(root, "new_held.md", {"acl_labels": []})
        yield settings, instance


def _paths(db, refs: list[str]) -> set[str]:
    numbers = [int(name.removeprefix("#")) for name in refs]
    return {rel_path for _, (_, rel_path) in store.documents.paths_of(db, numbers).items()}


def test_preview_reports_what_the_refresh_then_does_and_writes_nothing(every_change, db, capsys):
    settings, instance = every_change
    before = pg_dump(settings.database_url, "--format=plain")
    answer = preview_ingest(settings).as_dict(paths=True)
    # The job the UI launches gives the same answer, by ref; it writes nothing either.
    job = build_definitions(settings).resolve_job_def("preview_refresh")
    launched = job.execute_in_process(instance=instance)
    assert launched.success
    assert cli.main(["--config", str(settings.config_file), "ingest", "--dry-run"]) == 0
    assert pg_dump(settings.database_url, "--format=plain") == before  # byte for byte, data and schema

    printed = capsys.readouterr().out
    assert printed.startswith("dry run: nothing was written")
    lines = [line.split()[:2] for line in printed.splitlines()]
    assert ["relabelled", "relabel.md"] in lines and ["deleted", "gone.md"] in lines
    [output] = [e for e in launched.all_events if e.event_type_value == "STEP_OUTPUT"]
    metadata = output.event_specific_data.metadata
    job_answer = metadata["preview"].value
    assert job_answer["counts"] == answer["counts"] and metadata["deleted"].value == 2
    assert all("path" not in change for s in job_answer["sources"] for change in s["changes"])
    recorded = json.dumps(job_answer)  # what Dagster keeps names documents by ref only
    assert [name for name in ("keep", "change", "relabel", "hold", "gone", "release", "retitle", "move", "new")
            if f"{name}.md" in recorded] == []

    planned = {change: {c["path"] for c in answer["sources"][0]["changes"] if c["change"] == change}
               for change in CHANGE_CLASSES}
    assert planned == {
        "new": {"new.md", "new_held.md", "moved/move.md"}, "changed": {"change.md"}, "released": {"release.md"},
        "retitled": {"retitle.md"}, "relabelled": {"relabel.md", "release.md"}, "held": {"hold.md", "new_held.md"},
        "deleted": {"gone.md", "move.md"}, "deletions_held": set(), "adopted": set(),
    }
    work = answer["work"]
    # Parsed: the new, the moved (a folder keeps no ETag), the changed file and the released one (held since it
    # arrived: never parsed); chunked again from its kept text: the retitled one.
    assert (work["documents_to_parse"], work["documents_to_chunk"]) == (4, 1)
    assert work["chunks_relabelled_in_place"] > 0 and work["chunks_removed"] > 0

    summary = run_ingest(settings, instance=instance)
    assert summary["success"], summary.get("errors")
    for change in ("new", "changed", "released", "retitled", "relabelled", "held", "deleted", "deletions_held"):
        assert summary[change] == answer["counts"][change], change
    # Unchanged files: keep.md, and the relabelled and held ones, whose text is as it was.
    assert summary["unchanged"] == answer["counts"]["unchanged"] == 3
    named = summary["documents"]
    for change in ("new", "changed", "released", "retitled", "relabelled", "held"):
        assert _paths(db, named.get(change, [])) == planned[change], change
    deleted_refs = {c["document"] for c in answer["sources"][0]["changes"] if c["change"] == "deleted"}
    assert set(named["deleted"]) == deleted_refs


def test_preview_names_the_guard_that_would_hold_deletions(tmp_path, make_settings):
    root = tmp_path / "docs"
    for name in ("a.md", "b.md", "c.md"):
        _write(root, name, name.removesuffix(".md"))
    settings = make_settings([{"name": "docs", "root": str(root), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    (root / "a.md").unlink()
    (root / "b.md").unlink()
    held = preview_ingest(settings).as_dict()
    assert held["counts"]["deletions_held"] == 2 and held["counts"]["deleted"] == 0
    [guard] = held["sources"][0]["guards"]
    assert "max_deletion_share" in guard and "--confirm-deletions docs" in guard
    confirmed = preview_ingest(settings, confirm_deletions=["docs"]).as_dict()
    assert (confirmed["counts"]["deleted"], confirmed["sources"][0]["guards"]) == (2, [])

    # While a refresh scans the source, the preview says so instead of waiting for it (or making it wait).
    with psycopg.connect(settings.database_url) as scanning, scanning.transaction():
        store.sources.lock_source_scan(scanning, "docs")
        [busy] = preview_ingest(settings).as_dict()["sources"][0]["guards"]
    assert "a scan of this source is running now" in busy

    # A database behind this code's schema is refused, not migrated: a dry run writes nothing.
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("DELETE FROM schema_migrations WHERE version = '009_previous_versions.sql'")
    with pytest.raises(ConfigError, match=r"009_previous_versions.sql to apply\): run `rag-pipeline migrate`"):
        preview_ingest(settings)
