"""Hostile inputs at the source: awkward file names, symlinks out of the source, malformed sidecars, a 0-byte
and a 200 MB file (more in test_fail_closed.py). Each gets a clear outcome and none affects the other documents."""

import json
import os

from dagster import DagsterInstance

from rag_pipeline import store
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.lifecycle import checks
from rag_pipeline.retrieval.search import search

AWKWARD_NAMES = [
    "quote's \"double\".md",
    "with  spaces and tabs\t.md",
    "ünïcödé-文档-🚀.md",
    "-leading-dash.md",
    "--help.md",
    "a..b.md",
    "..dotdot.md",
    "semi;colon$(whoami).md",
]


def test_hostile_inputs_each_get_a_clear_outcome(make_settings, corpus, tmp_path, db):
    hostile = corpus / "hostile"
    hostile.mkdir()
    for index, name in enumerate(AWKWARD_NAMES):
        (hostile / name).write_text(f"# Note {index}\n\nThe awkward file number {index} mentions zebra{index}.\n")
    outside = tmp_path / "outside-secret.md"
    outside.write_text("# Secret\n\nThe vault code is 1234.\n")
    os.symlink(outside, hostile / "escape.md")
    os.symlink(tmp_path, hostile / "escape-dir")
    (hostile / "bad-sidecar.md").write_text("# Bad sidecar\n\nquokka\n")
    (hostile / "bad-sidecar.md.meta.json").write_text("{not json")
    (hostile / "empty.pdf").write_bytes(b"")
    with open(hostile / "huge.txt", "wb") as huge:  # 200 MB, sparse: never read
        huge.truncate(200 * 1024 * 1024)

    settings = make_settings([{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}])
    with DagsterInstance.ephemeral() as instance:
        summary = run_ingest(settings, instance=instance)
    assert summary["success"], summary.get("errors")

    problems = {p["path"]: p["problem"] for p in summary["problems"]}
    assert "outside the source root" in problems["hostile/escape.md"]
    # A sidecar that cannot be read holds its file back (never indexed with the wider default labels).
    status, reason = db.execute("SELECT status, held_reason FROM documents WHERE rel_path = 'hostile/bad-sidecar.md'"
                                ).fetchone()
    assert status == "held_bad_sidecar" and "json" in reason.lower()
    assert not any("outside-secret" in path or "vault" in path for path in problems)
    dead = {d["rel_path"]: d["reason"] for d in store.pages.dead_letter_summary(db)}
    assert dead["hostile/empty.pdf"] == "empty" and dead["hostile/huge.txt"] == "too_large"

    statuses = dict(db.execute("SELECT rel_path, status FROM documents WHERE rel_path LIKE 'hostile/%'").fetchall())
    for index, name in enumerate(AWKWARD_NAMES):
        assert statuses[f"hostile/{name}"] == "indexed", name
        (hit,) = search(db, f"zebra{index}", "staff", k=1, mode="sparse")
        assert hit.path == f"hostile/{name}"
    # The symlinked secret is nowhere: no document, no chunk.
    assert not any("vault" in hit.text for hit in search(db, "vault code 1234", "staff", k=10))
    assert "hostile/escape.md" not in statuses and not any(p.startswith("hostile/escape-dir") for p in statuses)
    # The rest of the corpus is untouched, and every protecting check passes.
    assert statuses.keys() >= {f"hostile/{n}" for n in AWKWARD_NAMES}
    assert db.execute("SELECT count(*) FROM documents WHERE status = 'indexed' AND rel_path NOT LIKE 'hostile/%'"
                      ).fetchone()[0] == 5
    for check in (checks.deletion_replay, checks.acl_coverage, checks.index_drift):
        assert check(db).passed
    assert json.loads(json.dumps(summary))["dead_letter_reasons"] == {"empty": 1, "too_large": 1, "truncated": 1}
