"""The code location loads, and the CLI runs the job against a real Postgres-backed Dagster instance
whose runs and materializations the webserver (the UI) then serves."""

import contextlib
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest
import yaml
from dagster import AssetKey, DagsterInstance

from rag_pipeline.defs.code_location import build_definitions
from rag_pipeline.defs.ingestion import ingestion_assets
from rag_pipeline.lifecycle.checks import CHECK_NAMES
from rag_pipeline.store.database import ensure_database
from rag_pipeline_tests.conftest import HEAVY_MODULES, imported_modules

REPO = Path(__file__).resolve().parent.parent
ASSET_NAMES = ["source_documents", "parsed_documents", "document_chunks", "search_index"]


def test_definitions_load_from_the_workspace_module(make_settings):
    import rag_pipeline.definitions as module

    assert module.defs.resolve_job_def("ingest") is not None
    settings = make_settings()
    defs = build_definitions(settings)
    keys = {key for assets in ingestion_assets(settings) for key in assets.keys}
    assert keys == {AssetKey(name) for name in ASSET_NAMES}
    specs = {spec.key.to_user_string(): spec for assets in ingestion_assets(settings) for spec in assets.specs}
    assert all(spec.kinds == {"python", "postgres"} for spec in specs.values())
    # Code versions name what the output depends on, so the UI can mark what a parser or chunker change leaves stale.
    assert specs["parsed_documents"].code_version.startswith("rp") and "pdfplumber=" in specs["parsed_documents"].code_version
    assert specs["document_chunks"].code_version.endswith(";overlap=0")
    assert specs["search_index"].code_version.endswith("|auto:all-MiniLM-L6-v2")
    other = make_settings(chunking={"max_tokens": 128})
    assert {s.key.to_user_string(): s for a in ingestion_assets(other) for s in a.specs}[
        "document_chunks"].code_version != specs["document_chunks"].code_version
    schedule = defs.resolve_schedule_def("incremental_refresh")
    assert schedule.cron_schedule == "0 * * * *"
    workspace = yaml.safe_load((REPO / "workspace.yaml").read_text())
    assert workspace["load_from"][0]["python_module"]["module_name"] == "rag_pipeline.definitions"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _graphql(port: int, query: str, variables: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _wait_for_webserver(port: int, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5)
            return
        except OSError:
            assert time.monotonic() < deadline, "webserver did not come up"
            time.sleep(1)


@contextlib.contextmanager
def _ui(cli: list[str], env: dict, cwd: Path):
    """`rag-pipeline ui` (webserver and daemon) on a free port, once it answers; stopped afterwards."""
    port = _free_port()
    server = subprocess.Popen([*cli, "ui", "--host", "127.0.0.1", "--port", str(port)], env=env, cwd=cwd,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_for_webserver(port)
        yield port
    finally:
        os.killpg(server.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it: dg dev stops webserver and daemon
        stopped = server.wait(timeout=60)
    assert stopped == 0  # a stop the user asked for is a clean exit: `make run` ends without "Error 1"


def _shipped_config_without_sources(tmp_path: Path) -> Path:
    """The shipped rag_pipeline.yaml with its paths made absolute and no configured source: the CLI test's
    folder comes from the command line (a command line may not redefine a configured source)."""
    config = yaml.safe_load((REPO / "rag_pipeline.yaml").read_text())
    config["sources"] = []
    config["checks"]["golden_set"] = str(REPO / config["checks"]["golden_set"])
    config["embedding"]["models_dir"] = str(REPO / config["embedding"]["models_dir"])
    path = tmp_path / "rag_pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture
def cli_env(tmp_path, db_url, pg_admin_url):
    dagster_db = f"dagster_{tmp_path.name[-8:].replace('-', '_')}"
    ensure_database(pg_admin_url, dagster_db)
    env = dict(os.environ)
    env.update(
        RAG_DATABASE_URL=db_url,
        RAG_DAGSTER_DATABASE_URL=psycopg.conninfo.make_conninfo(pg_admin_url, dbname=dagster_db),
        RAG_DATA_DIR=str(tmp_path / "data"),  # the project's own Dagster instance lives under it
        RAG_CONFIG=str(_shipped_config_without_sources(tmp_path)),
        HF_HUB_OFFLINE="1",
    )
    env.pop("DAGSTER_HOME", None)
    return env


def _sessions(url: str) -> int:
    """Connections ever made to `url`'s database (this one included)."""
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()[0]


def _heavy_imports(importtime_log: str) -> set[str]:
    """The model-stack packages a `python -X importtime` run imported."""
    return imported_modules(importtime_log) & set(HEAVY_MODULES)


def test_cli_ingest_is_a_dagster_run_the_ui_shows(cli_env, corpus, tmp_path):
    cli = [sys.executable, "-m", "rag_pipeline.cli"]
    first = subprocess.run(
        [*cli, "ingest", "--source", f"adhoc={corpus}", "--labels", "staff", "--json"],
        env=cli_env, capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    assert first.returncode == 0, first.stderr[-3000:]
    summary = json.loads(first.stdout)
    for key in ("documents_seen", "parsed", "unchanged", "deleted", "dead_lettered", "chunks_written",
                "vectors_embedded", "vectors_reused"):
        assert key in summary
    assert summary["parsed"] == 5 and summary["vectors_embedded"] == summary["chunks_written"] > 0
    assert summary["held"] == 1 and summary["held_now"] == 1  # drafts/ has an empty label list: held back
    # Each change's documents, by ref and (here, not in Dagster's records) by path.
    assert len(summary["documents"]["new"]) == 7 and all(d["document"].startswith("#") and d["source"] == "adhoc"
                                                         for d in summary["documents"]["new"])
    assert [d["path"] for d in summary["documents"]["held"]] == ["drafts/unreviewed-notes.md"]
    assert not (tmp_path / "data" / "pg").exists()  # RAG_DATABASE_URL set: nothing embedded was started

    # -X importtime lists every module the command imported: a run with nothing to do, and a search, pay for no
    # model stack (torch alone costs seconds to import).
    traced = [sys.executable, "-X", "importtime", "-m", "rag_pipeline.cli"]
    sessions_before = _sessions(cli_env["RAG_DAGSTER_DATABASE_URL"])
    second = subprocess.run(
        [*traced, "ingest", "--source", f"adhoc={corpus}", "--labels", "staff", "--json"],
        env=cli_env, capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    again = json.loads(second.stdout)
    # The run's hundreds of storage statements share a few pooled connections (a connection each: some 180).
    assert _sessions(cli_env["RAG_DAGSTER_DATABASE_URL"]) - sessions_before < 40
    assert again["parsed"] == 0 and again["vectors_embedded"] == 0 and again["unchanged"] == 7
    assert _heavy_imports(second.stderr) == set()
    assert "httpx" not in imported_modules(second.stderr)  # no endpoint configured: no HTTP client (0.15 s)
    assert again["held"] == 0 and again["held_now"] == 1  # still held, not newly
    as_text = subprocess.run([*cli, "ingest", "--source", f"adhoc={corpus}", "--labels", "staff"], env=cli_env,
                             capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert re.search(r"^  held now +1 \(newly held: 0\)$", as_text.stdout, re.M), as_text.stdout
    assert "drafts/unreviewed-notes.md" in as_text.stdout  # the one it says is held, listed

    found = subprocess.run(
        [*traced, "search", "battery life of the warehouse robot", "--labels", "staff", "-k", "3", "--json"],
        env=cli_env, capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    hits = json.loads(found.stdout)
    assert hits and hits[0]["path"] == "products/nw200-faq.html"
    listed = subprocess.run([*cli, "search", "battery life of the warehouse robot", "--labels", "staff", "-k", "3"],
                            env=cli_env, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    first_line = listed.stdout.splitlines()[0]
    assert first_line.startswith(f" 1. similarity {hits[0]['similarity']:.3f}  (rank score {hits[0]['score']:.4f})")
    # A new index is int8 (embedding.backend auto): its query model is onnxruntime itself (0.1 s), no torch and
    # no transformers (the tokenizer is read by `tokenizers`).
    assert _heavy_imports(found.stderr) <= {"onnxruntime"}
    assert {"chunk_id", "doc_id", "path", "page_start", "page_end", "score", "text"} <= set(hits[0])
    no_labels = subprocess.run([*cli, "search", "battery"], env=cli_env, capture_output=True, text=True)
    assert no_labels.returncode != 0 and "--labels" in no_labels.stderr
    # A misspelt label widens nothing, and the CLI says that no document carries it (not just "no results").
    misspelt = subprocess.run([*cli, "search", "battery", "--labels", "Staff,staf"], env=cli_env, capture_output=True,
                              text=True, timeout=300)
    assert misspelt.returncode == 0 and misspelt.stdout.strip() == "no results"
    assert "no indexed document carries the labels 'Staff', 'staf'" in misspelt.stderr, misspelt.stderr
    assert "carries the label" not in found.stderr  # staff is held: no note

    listed = subprocess.run([*cli, "index", "list", "--json"], env=cli_env, capture_output=True, text=True)
    (version,) = json.loads(listed.stdout)
    assert version["active"] and version["status"] == "active" and version["dimensions"] == 384
    assert version["rows"] == summary["chunks_written"] - summary["near_duplicates"]
    missing = subprocess.run([*cli, "search", "battery", "--labels", "staff", "--index-version", "99"], env=cli_env,
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "no searchable index version 99" in missing.stderr

    # The runs live in Dagster's Postgres storage: the same instance the UI reads.
    home = str(tmp_path / "data" / "dagster_home")  # the project's own instance, under RAG_DATA_DIR
    os.environ["DAGSTER_HOME"] = home
    try:
        with DagsterInstance.get() as instance:
            runs = instance.get_runs()
            assert [run.job_name for run in runs] == ["ingest"] * 3  # JSON, JSON traced, text
            latest_run_id = runs[0].run_id  # the text run: newest first
            assert "postgres" in type(instance.run_storage).__module__
    finally:
        del os.environ["DAGSTER_HOME"]

    # An embedding-model build from the shell (the same weights: every vector from the cache), promoted, so that
    # the UI can start the next one.
    built = subprocess.run([*cli, "index", "build", "--model", "all-MiniLM-L6-v2", "--json"], env=cli_env,
                           capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    cli_build = json.loads(built.stdout)
    promoted = subprocess.run([*cli, "index", "promote", str(cli_build["version"]), "--json"], env=cli_env,
                              capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert promoted.returncode == 0, promoted.stderr[-3000:]

    # `rag-pipeline ui`: `dg dev` (webserver and daemon) on the same instance the CLI's runs went to.
    with _ui(cli, cli_env, tmp_path) as port:
        _builds_are_backfills_of_their_version(port, cli_build)
        result = _graphql(
            port,
            "{ assetsOrError { ... on AssetConnection { nodes { key { path } "
            "assetMaterializations(limit: 1) { runId } } } } }",
        )
        nodes = {tuple(n["key"]["path"]): n for n in result["data"]["assetsOrError"]["nodes"]}
        for name in ASSET_NAMES:
            assert nodes[(name,)]["assetMaterializations"], name
        latest_runs = {nodes[(name,)]["assetMaterializations"][0]["runId"] for name in ASSET_NAMES}
        assert latest_runs == {latest_run_id}

        # The six checks, with the results of the last run and their metadata tables.
        result = _graphql(
            port,
            "{ assetNodes { assetKey { path } assetChecksOrError { ... on AssetChecks { checks { name blocking "
            "executionForLatestMaterialization { status runId evaluation { success severity description "
            "metadataEntries { label } } } } } } } }",
        )
        checks = {
            check["name"]: check
            for node in result["data"]["assetNodes"]
            for check in node["assetChecksOrError"].get("checks", [])
        }
        assert set(checks) == set(CHECK_NAMES)
        for name, check in checks.items():
            execution = check["executionForLatestMaterialization"]
            assert execution["runId"] == latest_run_id and execution["status"] == "SUCCEEDED", name
            assert execution["evaluation"]["success"], (name, execution["evaluation"]["description"])
        assert {name for name, check in checks.items() if check["blocking"]} == {
            "staleness", "deletion_replay", "acl_coverage", "index_drift"}  # staleness: ERROR only for a failed scan
        quality = checks["retrieval_quality"]["executionForLatestMaterialization"]["evaluation"]
        assert "against_baseline" in {entry["label"] for entry in quality["metadataEntries"]}
        assert "recall@10" in quality["description"]
        _look_in_a_browser(port, again)


BACKFILLS = """{ partitionBackfillsOrError { ... on PartitionBackfills { results { id status title tags { key value }
    assetBackfillData { assetBackfillStatuses { ... on AssetPartitionsStatusCounts { assetKey { path }
    numPartitionsTargeted numPartitionsMaterialized numPartitionsFailed } } } } } } }"""


def _build_backfills(port: int) -> dict[str, dict]:
    """Each build's backfill as the Backfills tab shows it, by the version it builds: status and partition counts."""
    result = _graphql(port, BACKFILLS)["data"]["partitionBackfillsOrError"]["results"]
    return {tags["rag_pipeline/index_version"]: {"status": backfill["status"], **backfill["assetBackfillData"][
                "assetBackfillStatuses"][0]}
            for backfill in result for tags in [{t["key"]: t["value"] for t in backfill["tags"]}]
            if "rag_pipeline/index_version" in tags}


def _builds_are_backfills_of_their_version(port: int, cli_build: dict) -> None:
    """A build from the shell is a finished backfill of its version's eight partitions; one the UI starts
    (start_index_build) is a backfill the daemon runs, of its own version's partitions, and finishes."""
    label = f"v{cli_build['version']}"
    assert _build_backfills(port)[label] == {
        "status": "COMPLETED_SUCCESS", "assetKey": {"path": ["index_version_backfill"]},
        "numPartitionsTargeted": 8, "numPartitionsMaterialized": 8, "numPartitionsFailed": 0}
    launched = _graphql(port, """mutation($config: RunConfigData) { launchRun(executionParams: {
        selector: {repositoryLocationName: "rag_pipeline", repositoryName: "__repository__",
                   jobName: "start_index_build"}, runConfigData: $config}) {
        __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }""",
        {"config": {"ops": {"start_index_version": {"config": {"model": "all-MiniLM-L6-v2"}}}}})
    assert launched["data"]["launchRun"]["__typename"] == "LaunchRunSuccess", launched
    ui_label = f"v{cli_build['version'] + 1}"
    deadline = time.monotonic() + 420
    while (build := _build_backfills(port).get(ui_label, {})).get("status") != "COMPLETED_SUCCESS":
        assert build.get("status") not in ("FAILED", "COMPLETED_FAILED", "CANCELED"), build
        assert time.monotonic() < deadline, f"the UI's build did not finish: {build}"
        time.sleep(5)
    assert (build["numPartitionsTargeted"], build["numPartitionsMaterialized"]) == (8, 8)
    # The partition view: each version's shards are its own partitions.
    stats = _graphql(port, """{ assetNodeOrError(assetKey: {path: ["index_version_backfill"]}) {
        ... on AssetNode { partitionKeysByDimension { name partitionKeys } } } }""")
    dimensions = {d["name"]: d["partitionKeys"] for d in stats["data"]["assetNodeOrError"]["partitionKeysByDimension"]}
    assert {label, ui_label} <= set(dimensions["version"]) and len(dimensions["shard"]) == 8


SCREENSHOTS = REPO / ".test-artifacts" / "browser"


def _look_in_a_browser(port: int, summary: dict) -> None:
    """The UI as a person sees it, in headless Chromium (Debian's package, driven by Playwright): the asset graph,
    the search_index checks, and the latest materialization of search_index with the index's totals. Screenshots
    are kept in .test-artifacts/browser/."""
    chromium = shutil.which("chromium")
    if chromium is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed: .ci/run installs Debian's chromium package")
        pytest.skip("chromium is not installed (apt-get install chromium): everything but this test's browser part "
                    "passed")
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect, sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{port}"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(f"{base}/locations/rag_pipeline/asset-groups/ingestion")
            skip = page.get_by_role("button", name="Skip")  # the UI's one-time community invitation
            with contextlib.suppress(PlaywrightTimeout):  # not every Dagster release shows it
                skip.click(timeout=15_000)
            for name in ASSET_NAMES:
                expect(page.get_by_text(name, exact=True).first).to_be_visible(timeout=60_000)
            # search_index's checks, on the graph: the node's live data (latest event, checks) loads after its name
            expect(page.get_by_text("5 / 5 Passed").first).to_be_visible(timeout=60_000)
            page.screenshot(path=SCREENSHOTS / "asset-graph.png")

            page.goto(f"{base}/assets/search_index?view=checks")
            for name in set(CHECK_NAMES) - {"parse_health"}:  # parse_health is parsed_documents' check
                expect(page.get_by_text(name, exact=True).first).to_be_visible(timeout=60_000)
            page.screenshot(path=SCREENSHOTS / "search-index-checks.png", full_page=True)

            page.goto(f"{base}/assets/search_index?view=events")
            for label in ("index_documents_indexed", "index_vectors", "index_pages_by_tier"):
                expect(page.get_by_text(label, exact=True).first).to_be_visible(timeout=60_000)
            page.screenshot(path=SCREENSHOTS / "search-index-latest-materialization.png", full_page=True)
        finally:
            browser.close()


def _in_a_terminal(command: list[str], env: dict, cwd: Path) -> tuple[int, str]:
    """Run `command` on a pseudo-terminal, as a user at a shell would; its exit code and what the screen got."""
    import fcntl
    import pty
    import struct
    import termios

    main_fd, terminal_fd = pty.openpty()
    fcntl.ioctl(terminal_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen(command, stdin=terminal_fd, stdout=terminal_fd, stderr=terminal_fd, env=env, cwd=cwd)
    os.close(terminal_fd)
    screen = bytearray()
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main_fd], [], [], 1.0)
        if not ready:
            if process.poll() is not None:
                break  # done; nothing more was written
            continue
        try:
            data = os.read(main_fd, 65536)
        except OSError:  # the terminal closed: the process and its children are done with it
            break
        if not data:
            break
        screen += data
    os.close(main_fd)
    return process.wait(timeout=60), screen.decode("utf-8", errors="replace")


def test_ingest_at_a_terminal_draws_bars_that_log_lines_do_not_break(cli_env, corpus, tmp_path):
    code, screen = _in_a_terminal([sys.executable, "-m", "rag_pipeline.cli", "ingest", "--source",
                                   f"adhoc={corpus}", "--labels", "staff"], cli_env, tmp_path)
    assert code == 0, screen[-3000:]
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)
    # No log line glued to a bar (Dagster tees a step's output to the terminal from another process).
    assert not re.search(r"\S\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} [+-]\d{4} - dagster", plain), plain[-3000:]
    # Each bar counts documents and says so; its units (pages, chunks) are named as what they are.
    assert re.search(r"parse and chunk +\S+ 6/6 documents · \d+ pages", plain), plain[-3000:]
    assert re.search(r"index +\S+ 5/5 documents · \d+ chunks", plain), plain[-3000:]
    assert " 0/0 " not in plain and "Loading weights" not in plain  # no other progress bar writes through them
    assert "run " in plain and "succeeded" in plain and "held now" in plain


def test_a_stop_sent_to_the_ui_command_alone_stops_the_ui_it_started(cli_env, tmp_path):
    import psutil

    port = _free_port()
    command = subprocess.Popen([sys.executable, "-m", "rag_pipeline.cli", "ui", "--port", str(port)], env=cli_env,
                               cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        _wait_for_webserver(port)
        started = psutil.Process(command.pid).children(recursive=True)
        assert started  # dg dev, its webserver and daemon
        command.send_signal(signal.SIGTERM)  # to this process only, as a supervisor stopping a service does
        assert command.wait(timeout=60) in (0, 128 + signal.SIGTERM)
        _, alive = psutil.wait_procs(started, timeout=60)
        assert alive == []  # nothing it started outlives it
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(command.pid, signal.SIGKILL)


def test_every_cli_option_has_help_and_the_version_is_not_an_index_version(capsys):
    import argparse

    from rag_pipeline.cli import build_parser, package_version

    def walk(parser: argparse.ArgumentParser, path: str) -> list[str]:
        missing = []
        for action in parser._actions:  # argparse offers no public walk over its options
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    missing += walk(child, f"{path} {name}")
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
        return missing

    assert walk(build_parser(), "rag-pipeline") == []
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip() == f"rag-pipeline {package_version()}"
    assert build_parser().parse_args(["search", "q", "--labels", "a", "--index-version", "2"]).index_version == 2


def test_exit_codes_follow_the_documented_table(clone, capsys):
    from rag_pipeline import cli

    conn, settings = clone
    config = str(settings.config_file)
    active = conn.execute("SELECT version_id FROM index_alias WHERE alias = 'active'").fetchone()[0]
    assert cli.main(["--config", config, "index", "retire", str(active)]) == cli.EXIT_REFUSED  # lifecycle refusal
    assert "refused:" in capsys.readouterr().err
    assert cli.main(["--config", config, "search", "x", "--labels", "staff", "--index-version", "99"]) == cli.EXIT_USAGE
    broken = settings.config_file.with_name("broken.yaml")
    broken.write_text("retrieval: {k: 0}\n")
    assert cli.main(["--config", str(broken), "search", "x", "--labels", "staff"]) == cli.EXIT_USAGE
    assert cli.main(["--config", config, "checks"]) in (cli.EXIT_OK, cli.EXIT_FAILED)
    unreachable = settings.config_file.with_name("unreachable.yaml")
    unreachable.write_text(yaml.safe_dump({"database_url": "postgresql://nobody@127.0.0.1:1/none"}))
    assert cli.main(["--config", str(unreachable), "index", "list"]) == cli.EXIT_ERROR
    # serve checks its configuration before it says it is serving: a token variable that is not set is refused
    # with its key, and nothing announced a service that never listened.
    tokenless = settings.config_file.with_name("tokenless.yaml")
    tokenless.write_text(settings.config_file.read_text() + "service: {tokens: [{name: bot, env: RAG_TEST_NO_SUCH_TOKEN, "
                         "labels: [staff]}]}\n")
    capsys.readouterr()
    assert cli.main(["--config", str(tokenless), "serve"]) == cli.EXIT_USAGE
    said = capsys.readouterr()
    assert "service.tokens[0].env" in said.err and "search service on" not in said.out
    # An expected failure is one line, and its traceback is there with --debug.
    missing = str(settings.config_file.with_name("no-such-golden.jsonl"))
    assert cli.main(["--config", config, "eval", missing, "--labels", "staff"]) == cli.EXIT_USAGE
    assert capsys.readouterr().err.splitlines() == [f"error: No such file or directory: {missing}"]
    assert cli.main(["--config", config, "--debug", "eval", missing, "--labels", "staff"]) == cli.EXIT_USAGE
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    # The table in the module's help is the one these constants implement.
    for code in (cli.EXIT_OK, cli.EXIT_FAILED, cli.EXIT_USAGE, cli.EXIT_REFUSED, cli.EXIT_DELETIONS_HELD, cli.EXIT_ERROR):
        assert f"\n  {code}  " in cli.__doc__


KILLED_RUN_BOUND_SECONDS = 240  # from the launch of the queued run to its success: monitoring 10 s, a run start


def _runs(home: Path) -> list:
    previous = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        with DagsterInstance.get() as instance:
            return [(run.run_id, run.status.value, run.job_name) for run in instance.get_runs()]
    finally:
        if previous is None:
            del os.environ["DAGSTER_HOME"]
        else:
            os.environ["DAGSTER_HOME"] = previous


def _run_failure_message(home: Path, run_id: str) -> str:
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        with DagsterInstance.get() as instance:
            return " ".join(str(e.message) for e in instance.all_logs(run_id) if e.is_dagster_event
                            and e.dagster_event.event_type_value == "PIPELINE_FAILURE")
    finally:
        del os.environ["DAGSTER_HOME"]


def _kill_mid_run(cli: list[str], env: dict, cwd: Path, home: Path) -> str:
    """Start `rag-pipeline ingest`, SIGKILL it (with its workers) once its run is STARTED; the run's id."""
    before = {run[0] for run in _runs(home)} if (home / "dagster.yaml").exists() else set()
    process = subprocess.Popen([*cli, "ingest"], env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, "the ingest ended before it could be killed"
        assert time.monotonic() < deadline, "the ingest's run never started"
        started = [run for run in _runs(home) if run[0] not in before and run[1] == "STARTED"] \
            if (home / "dagster.yaml").exists() else []
        if started:
            break
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    (run_id, status, _), = [run for run in _runs(home) if run[0] == started[0][0]]
    assert status == "STARTED"  # nothing was left to say it failed
    return run_id


def test_a_killed_run_blocks_nothing_with_the_daemon_running_or_from_the_cli(cli_env, tmp_path):
    """kill -9 of an ingest leaves its run STARTED. With `rag-pipeline ui` (webserver and daemon) running, an
    ingest launched from the UI queues behind it (one index writer at a time), the daemon's run monitoring marks
    the dead run failed, and the queued ingest starts and succeeds within KILLED_RUN_BOUND_SECONDS. The CLI,
    before it starts, marks failed its own runs whose process is gone. Before (4500a88) the queued run waited for
    ever."""
    corpus = tmp_path / "corpus"
    shutil.copytree(REPO / "sample_corpus", corpus)
    config = yaml.safe_load(Path(cli_env["RAG_CONFIG"]).read_text())
    config["sources"] = [{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}]
    Path(cli_env["RAG_CONFIG"]).write_text(yaml.safe_dump(config))
    cli = [str(Path(sys.executable).with_name("rag-pipeline"))]
    home = tmp_path / "data" / "dagster_home"
    killed = _kill_mid_run(cli, cli_env, tmp_path, home)

    with _ui(cli, cli_env, tmp_path) as port:
        launched_at = time.monotonic()
        result = _graphql(port, """mutation { launchRun(executionParams: {selector: {repositoryLocationName:
            "rag_pipeline", repositoryName: "__repository__", jobName: "ingest"}, runConfigData: "{}"}) {
            __typename ... on LaunchRunSuccess { run { runId status } } ... on PythonError { message } } }""")
        launch = result["data"]["launchRun"]
        assert launch["__typename"] == "LaunchRunSuccess", launch
        queued = launch["run"]["runId"]
        while True:
            statuses = {run_id: status for run_id, status, _ in _runs(home)}
            if statuses[queued] in ("SUCCESS", "FAILURE", "CANCELED"):
                break
            assert time.monotonic() - launched_at < KILLED_RUN_BOUND_SECONDS, statuses
            time.sleep(2)
        assert statuses[queued] == "SUCCESS"
        assert statuses[killed] == "FAILURE"
        os.environ["DAGSTER_HOME"] = str(home)
        try:
            with DagsterInstance.get() as instance:  # it waited for the dead run, not beside it
                assert (instance.get_run_record_by_id(queued).start_time
                        >= instance.get_run_record_by_id(killed).end_time)
        finally:
            del os.environ["DAGSTER_HOME"]
        assert "worker process" in _run_failure_message(home, killed)

    # Without the daemon: the next CLI run marks its own dead run failed before it starts.
    killed_again = _kill_mid_run(cli, cli_env, tmp_path, home)
    again = subprocess.run([*cli, "ingest", "--json"], env=cli_env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    statuses = {run_id: status for run_id, status, _ in _runs(home)}
    assert statuses[killed_again] == "FAILURE" and "worker process" in _run_failure_message(home, killed_again)
