import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rag_pipeline.config import ConfigError, SourceConfig, load_settings, parse_duration, parse_labels
from rag_pipeline.domain import ids
from rag_pipeline.domain.status import DocumentStatus
from rag_pipeline.sources.folders import ScanReport, UnsafePathError, safe_join, scan_source


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
    (root / "team" / "deep" / "c.md.meta.json").write_text(json.dumps({"title": "C doc", "acl_labels": ["x", "y"]}))
    (root / "team" / "secret.md").write_text("s")
    (root / "team" / "secret.md.meta.json").write_text(json.dumps({"acl_labels": [], "password": "pw"}))


def test_scan_applies_sidecars_and_default_deny(tmp_path):
    _tree(tmp_path)
    source = SourceConfig(name="docs", root=tmp_path, include=("*.md",), acl_labels=("staff",))
    found = {f.rel_path: f for f in scan_source(source)}
    assert sorted(found) == ["a.md", "team/b.md", "team/deep/c.md", "team/secret.md"]
    assert found["a.md"].acl_labels == ("staff",)
    assert found["team/b.md"].acl_labels == ("team",)
    assert found["team/b.md"].metadata == {"owner": "ops"}
    assert found["team/deep/c.md"].acl_labels == ("x", "y")
    assert found["team/deep/c.md"].title == "C doc"
    assert found["team/secret.md"].acl_labels == ()  # explicit empty list: nobody, so it will be held back
    assert "password" not in found["team/secret.md"].metadata
    assert found["a.md"].doc_id == ids.doc_id("docs", "a.md") != ids.doc_id("other", "a.md")


def _judged(found):
    return {f.rel_path: (f.acl_labels, f.title, f.metadata, f.held, f.read_path) for f in found}


def test_scan_judges_from_its_folder_listing_as_from_the_disk(tmp_path, monkeypatch):
    """Files older than the scan are judged from their folder's listing (no stat of a sidecar, no resolving of a
    path that is not a link): the same labels, holds and read paths as files judged from the disk."""
    _tree(tmp_path)
    (tmp_path / "d.md").write_text("d")
    (tmp_path / "d.md.meta.json").mkdir()  # a sidecar that is a folder: unreadable, so d.md is held
    (tmp_path / "team" / "link.md").symlink_to(tmp_path / "team" / "deep" / "c.md")
    source = SourceConfig(name="docs", root=tmp_path, include=("*.md",), acl_labels=("staff",))
    from_disk = _judged(scan_source(source))  # every file is new: each sidecar is looked for
    real_time_ns = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + 3600 * 10**9)  # an hour on: the listing decides
    from_listing = _judged(scan_source(source))
    assert from_listing == from_disk
    assert from_disk["a.md"][4] is None and from_disk["team/link.md"][4] == "team/deep/c.md"
    assert from_disk["team/link.md"][0] == ("x", "y")  # a link speaks with its target's sidecar
    assert from_disk["d.md"][0] == () and from_disk["d.md"][3][0] == DocumentStatus.HELD_BAD_SIDECAR


def test_a_file_newer_than_the_scan_gets_the_sidecar_its_folder_listing_missed(tmp_path, monkeypatch):
    """A listing is no snapshot: one read while a writer adds a sidecar and then its file can show the file and
    not the sidecar. A file changed since the scan began is judged from the disk, so it never gets wider labels."""
    (tmp_path / "c.md").write_text("c")
    (tmp_path / "c.md.meta.json").write_text(json.dumps({"acl_labels": ["board"]}))
    real_walk = os.walk

    def racing_walk(*args, **kwargs):
        for dirpath, dirnames, filenames in real_walk(*args, **kwargs):
            yield dirpath, dirnames, [name for name in filenames if not name.endswith(".meta.json")]

    monkeypatch.setattr(os, "walk", racing_walk)
    found = list(scan_source(SourceConfig(name="docs", root=tmp_path, acl_labels=("staff",))))
    assert [(f.rel_path, f.acl_labels) for f in found] == [("c.md", ("board",))]


def test_a_sidecar_listed_under_another_case_or_normalisation_is_asked_of_the_disk(tmp_path, monkeypatch):
    """On a file system that ignores case or Unicode normalisation, `A.md.meta.json` (or a decomposed spelling)
    is the sidecar of `a.md`: a listing that spells it otherwise never decides that it is absent."""
    from rag_pipeline.sources import folders

    (tmp_path / "a.md").write_text("a")
    (tmp_path / "A.md.meta.json").write_text(json.dumps({"acl_labels": ["board"]}))
    (tmp_path / "caf\u00e9.md").write_text("c")
    (tmp_path / "cafe\u0301.md.meta.json").write_text(json.dumps({"acl_labels": ["board"]}))
    (tmp_path / "b.md").write_text("b")
    asked = []
    real_present = folders.sidecar_present
    monkeypatch.setattr(folders, "sidecar_present", lambda path: asked.append(path.name) or real_present(path))
    real_time_ns = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + 3600 * 10**9)  # every file older than the scan
    found = {f.rel_path: f.acl_labels for f in scan_source(SourceConfig(name="docs", root=tmp_path,
                                                                         acl_labels=("staff",)))}
    files_asked = sorted(name for name in asked if name != "_meta.json")  # the folder's own sidecar is always asked
    assert files_asked == ["a.md.meta.json", "caf\u00e9.md.meta.json"]  # b.md's absence is the listing's to say
    assert found["b.md"] == ("staff",)


def test_fingerprint_changes_with_mtime_not_with_identity(tmp_path):
    (tmp_path / "a.md").write_text("one")
    source = SourceConfig(name="docs", root=tmp_path, acl_labels=("s",))
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
    report = ScanReport()
    found = [f.rel_path for f in scan_source(SourceConfig(name="docs", root=root, acl_labels=("s",)), report)]
    assert found == ["ok.md"]
    assert [p.rel_path for p in report.problems] == ["link.md"]
    with pytest.raises(UnsafePathError):
        safe_join(root, "../outside/leak.md")
    with pytest.raises(UnsafePathError):
        safe_join(root, "/etc/passwd")
    with pytest.raises(UnsafePathError):
        safe_join(root, "link.md")
    assert safe_join(root, "ok.md") == (root / "ok.md").resolve()


def test_missing_root_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(scan_source(SourceConfig(name="docs", root=tmp_path / "nope")))


# Each mistake an operator makes in rag_pipeline.yaml, and the key the one-line error must name.
CONFIG_MISTAKES = [
    ("sources: [{name: a, root: ., acl_label: [hr]}]", "sources[0].acl_label: unknown key; did you mean acl_labels?"),
    ("sources: [{name: a, root: ., include: '*.pdf'}]", "sources[0].include: expected a list"),
    ("sources: [{name: a, root: ., acl_labels: 'hr, finance'}]", "sources[0].acl_labels: expected a list"),
    ("batch_size: -5", "batch_size: Input should be greater than or equal to 1"),
    ("batch_size: abc", "batch_size: Input should be a valid integer"),
    ("dedup: {threshold: 7}", "dedup.threshold: Input should be less than or equal to 1"),
    ("batchsize: 64", "batchsize: unknown key; did you mean batch_size?"),
    ("embedding: {modle: x}", "embedding.modle: unknown key; did you mean model?"),
    ("chunking: {max_token: 200}", "chunking.max_token: unknown key; did you mean max_tokens?"),
    ("retrieval: {min_similarty: 0.3}", "retrieval.min_similarty: unknown key; did you mean min_similarity?"),
    ("parsing: {vlm: {page_budgt: 3}}", "parsing.vlm.page_budgt: unknown key; did you mean page_budget?"),
    ("lock_timeout: soon", "lock_timeout: not a duration"),
    ("sources: [{name: a, root: ., acl_labels: [x], freshness_sla: 24 hours}]",
     "sources[0].freshness_sla: not a duration: '24 hours' (use e.g. 90s, 15m, 24h, 7d)"),
    ("refresh_cron: every hour", "refresh_cron: not a cron expression"),
    ("sources: [{name: a, root: .}, {name: a, root: .}]", "sources: duplicate source names"),
    ("sources: [{name: 'bad name', root: .}]", "sources[0].name: String should match pattern"),
    ("checks: {golden_set: g.jsonl}", "checks: golden_set needs golden_labels"),
    ("prefix: {mode: llm}", "prefix: mode llm needs endpoint and model"),
    ("sources: [", "not valid YAML at line"),
    ("name: \x07", "not valid YAML"),
]


@pytest.mark.parametrize(("text", "expected"), CONFIG_MISTAKES)
def test_each_configuration_mistake_is_one_line_naming_the_key_and_file(tmp_path, capsys, text, expected):
    from rag_pipeline.cli import main

    config = tmp_path / "rag_pipeline.yaml"
    config.write_text(text + "\n")
    with pytest.raises(ConfigError) as raised:
        load_settings(config)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{config}: ") and expected in message, message
    assert message.count("'24 hours'") <= 1  # the value is said once, not again as "(got ...)"
    assert main(["--config", str(config), "config", "show"]) == 2
    assert capsys.readouterr().err == f"configuration error: {message}\n"


def test_a_command_run_without_a_configuration_file_says_so(tmp_path, monkeypatch, capsys):
    """Outside a checkout no rag_pipeline.yaml is found: the defaults apply, and the command says which data folder
    that means instead of silently using one."""
    from rag_pipeline.cli import main
    from rag_pipeline.config import ENV_OVERRIDES

    monkeypatch.chdir(tmp_path)
    for variable in ("RAG_CONFIG", *ENV_OVERRIDES):
        monkeypatch.delenv(variable, raising=False)
    main(["db", "status"])
    err = capsys.readouterr().err
    assert err.startswith("note: no configuration file (rag_pipeline.yaml here") and str(tmp_path / ".rag_data") in err
    monkeypatch.setenv("RAG_DATA_DIR", str(tmp_path / "data"))  # configured by variables alone: meant, no note
    main(["db", "status"])
    assert "no configuration file" not in capsys.readouterr().err
    monkeypatch.delenv("RAG_DATA_DIR")
    (tmp_path / "rag_pipeline.yaml").write_text("data_dir: here\n")
    main(["db", "status"])
    assert "no configuration file" not in capsys.readouterr().err


def test_cli_configuration_error_exits_2_without_a_traceback(tmp_path):
    config = tmp_path / "rag_pipeline.yaml"
    config.write_text("sources: [{name: a, root: ., acl_label: [hr]}]\n")
    result = subprocess.run([sys.executable, "-m", "rag_pipeline.cli", "--config", str(config), "ingest"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"configuration error: {config}: sources[0].acl_label: unknown key; did you mean acl_labels?"
    ]


def test_environment_overrides_are_validated_and_named(tmp_path, monkeypatch):
    config = tmp_path / "rag.yaml"
    config.write_text("embedding: {batch_size: 8}\n")
    monkeypatch.setenv("RAG_MODELS_DIR", "weights")
    monkeypatch.setenv("RAG_EMBEDDING_DEVICE", "cuda:1")
    settings = load_settings(config)
    assert settings.embedding.models_dir == (tmp_path / "weights").resolve()
    assert settings.embedding.device == "cuda:1" and settings.embedding.batch_size == 8
    monkeypatch.setenv("RAG_DATABASE_URL", "")  # empty: not set
    assert load_settings(config).database_url is None


def test_a_malformed_database_url_is_refused_when_the_configuration_loads_naming_the_key(tmp_path, monkeypatch):
    """Not a traceback at the first connection: one line naming the key and where it came from, without the
    password it may hold."""
    config = tmp_path / "rag.yaml"
    config.write_text("database_url: 'postgres//analyst:s3cret@db.internal/rag'\n")
    with pytest.raises(ConfigError) as raised:
        load_settings(config)
    assert "database_url: not a PostgreSQL connection string" in str(raised.value) and "s3cret" not in str(raised.value)
    config.write_text("embedding: {batch_size: 8}\n")
    monkeypatch.setenv("RAG_DAGSTER_DATABASE_URL", "postgresql://analyst:s3cret@db.internal:54x2/dagster")
    with pytest.raises(ConfigError) as raised:
        load_settings(config)
    message = str(raised.value)
    assert "dagster_database_url (from $RAG_DAGSTER_DATABASE_URL): its port is not a number" in message
    assert "s3cret" not in message
    # what libpq reads is accepted: URLs with several hosts, key=value pairs
    monkeypatch.setenv("RAG_DAGSTER_DATABASE_URL", "postgresql://u@h1,h2:5433/dagster?target_session_attrs=any")
    monkeypatch.setenv("RAG_DATABASE_URL", "host=/var/run/postgresql dbname=rag user=pipeline")
    settings = load_settings(config)
    assert settings.database_url == "host=/var/run/postgresql dbname=rag user=pipeline"


def test_a_malformed_database_url_is_one_line_and_exit_2_from_the_cli(tmp_path):
    import subprocess
    import sys

    config = tmp_path / "rag.yaml"
    config.write_text("database_url: 'postgres//localhost/rag'\n")
    done = subprocess.run([sys.executable, "-m", "rag_pipeline.cli", "--config", str(config), "index", "list"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "database_url" in done.stderr and "Traceback" not in done.stderr


def test_empty_sections_take_their_defaults_and_derived_values_are_filled(tmp_path):
    config = tmp_path / "rag.yaml"
    config.write_text("alerts:\nprefix: {mode: llm, endpoint: 'http://127.0.0.1:9/v1', model: m}\n")
    settings = load_settings(config)
    assert settings.alerts.webhook_url is None
    assert settings.chunking.prefix_token_budget == 96  # room for an LLM sentence beside the template
    assert load_settings(tmp_path / "rag.yaml").config_file == config
    # The default data folder is made absolute too (Dagster refuses a relative DAGSTER_HOME); with a file, it
    # is beside the file, not in the working directory.
    assert settings.data_dir == tmp_path / ".rag_data" and settings.dagster_home.is_absolute()


def test_the_committed_json_schema_is_current_and_validates_the_shipped_file():
    import jsonschema
    import yaml

    from rag_pipeline.config import json_schema, json_schema_text

    root = Path(__file__).resolve().parent.parent
    assert (root / "rag_pipeline.schema.json").read_text() == json_schema_text(), (
        "regenerate it: rag-pipeline config schema > rag_pipeline.schema.json"
    )
    validator = jsonschema.Draft202012Validator(json_schema())
    shipped = yaml.safe_load((root / "rag_pipeline.yaml").read_text())
    assert list(validator.iter_errors(shipped)) == []
    assert list(validator.iter_errors({**shipped, "batchsize": 3}))  # unknown keys are refused
    assert list(validator.iter_errors({"sources": [{"name": "a", "root": ".", "include": "*.pdf"}]}))
    assert not list(validator.iter_errors({"lock_timeout": "15m"}))
