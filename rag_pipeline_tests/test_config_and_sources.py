import json
import os
from pathlib import Path

import pytest

from rag_pipeline.config import ConfigError, SourceConfig, load_settings, parse_duration, parse_labels
from rag_pipeline.sources import UnsafePathError, doc_id_for, safe_join, scan_source


def test_durations_and_labels():
    assert parse_duration("90s") == 90
    assert parse_duration("15m") == 900
    assert parse_duration("24h") == 86400
    assert parse_duration(30) == 30
    with pytest.raises(ConfigError):
        parse_duration("soon")
    assert parse_labels(" a, b ,a,, ") == ("a", "b")
    assert parse_labels(None) == ()


def test_cli_source_spec(tmp_path):
    source = SourceConfig.from_cli(f"docs={tmp_path}", ("staff",))
    assert source.name == "docs" and source.root == tmp_path.resolve() and source.acl_labels == ("staff",)
    for bad in ("docs", "=path", "docs="):
        with pytest.raises(ConfigError):
            SourceConfig.from_cli(bad)
    with pytest.raises(ConfigError):
        SourceConfig.from_cli(f"bad name={tmp_path}")


def test_settings_file_and_environment(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    config = tmp_path / "rag.yaml"
    config.write_text(
        "data_dir: state\nembedding: {model: some/model}\n"
        "sources: [{name: docs, root: docs, acl_labels: [a], freshness_sla: 2h}]\n"
    )
    settings = load_settings(config)
    assert settings.data_dir == (tmp_path / "state").resolve()
    assert settings.sources[0].root == (tmp_path / "docs").resolve()
    assert settings.sources[0].freshness_sla_seconds == 7200
    assert settings.embedding.model == "some/model"
    assert settings.database_url is None
    monkeypatch.setenv("RAG_DATABASE_URL", "postgresql://x@h/db")
    monkeypatch.setenv("RAG_EMBEDDING_MODEL", "/models/other")
    settings = load_settings(config)
    assert settings.database_url == "postgresql://x@h/db"
    assert settings.dagster_database_url == "postgresql://x@h/db"
    assert settings.embedding.model == "/models/other"


def test_duplicate_source_names_rejected(tmp_path):
    config = tmp_path / "rag.yaml"
    config.write_text("sources: [{name: a, root: .}, {name: a, root: .}]\n")
    with pytest.raises(ConfigError, match="duplicate"):
        load_settings(config)


def _tree(root: Path) -> None:
    (root / "team" / "deep").mkdir(parents=True)
    (root / "a.md").write_text("# A\ntext")
    (root / "skip.bin").write_bytes(b"\x00")
    (root / "team" / "_meta.json").write_text(json.dumps({"acl_labels": ["team"], "owner": "ops"}))
    (root / "team" / "b.md").write_text("b")
    (root / "team" / "deep" / "c.md").write_text("c")
    (root / "team" / "deep" / "c.md.meta.json").write_text(json.dumps({"title": "C doc", "acl_labels": "x, y"}))
    (root / "team" / "secret.md").write_text("s")
    (root / "team" / "secret.md.meta.json").write_text(json.dumps({"acl_labels": [], "password": "pw"}))


def test_scan_applies_sidecars_and_default_deny(tmp_path):
    _tree(tmp_path)
    source = SourceConfig("docs", tmp_path, include=("*.md",), acl_labels=("staff",))
    found = {f.rel_path: f for f in scan_source(source)}
    assert sorted(found) == ["a.md", "team/b.md", "team/deep/c.md", "team/secret.md"]
    assert found["a.md"].acl_labels == ("staff",)
    assert found["team/b.md"].acl_labels == ("team",)
    assert found["team/b.md"].metadata == {"owner": "ops"}
    assert found["team/deep/c.md"].acl_labels == ("x", "y")
    assert found["team/deep/c.md"].title == "C doc"
    assert found["team/secret.md"].acl_labels == ()  # explicit empty list: nobody, so it will be held back
    assert "password" not in found["team/secret.md"].metadata
    assert found["a.md"].doc_id == doc_id_for("docs", "a.md") != doc_id_for("other", "a.md")


def test_fingerprint_changes_with_mtime_not_with_identity(tmp_path):
    (tmp_path / "a.md").write_text("one")
    source = SourceConfig("docs", tmp_path, acl_labels=("s",))
    before = next(scan_source(source))
    os.utime(tmp_path / "a.md", ns=(before.mtime_ns + 10**9, before.mtime_ns + 10**9))
    after = next(scan_source(source))
    assert before.doc_id == after.doc_id and before.fingerprint != after.fingerprint


def test_symlink_escape_is_refused(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "leak.md").write_text("secret")
    (root / "ok.md").write_text("fine")
    (root / "link.md").symlink_to(outside / "leak.md")
    (root / "dirlink").symlink_to(outside, target_is_directory=True)
    problems = []
    found = [f.rel_path for f in scan_source(SourceConfig("docs", root, acl_labels=("s",)), problems)]
    assert found == ["ok.md"]
    assert [p.rel_path for p in problems] == ["link.md"]
    with pytest.raises(UnsafePathError):
        safe_join(root, "../outside/leak.md")
    with pytest.raises(UnsafePathError):
        safe_join(root, "/etc/passwd")
    with pytest.raises(UnsafePathError):
        safe_join(root, "link.md")
    assert safe_join(root, "ok.md") == (root / "ok.md").resolve()


def test_missing_root_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(scan_source(SourceConfig("docs", tmp_path / "nope")))
