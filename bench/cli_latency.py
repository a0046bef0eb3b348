"""What a user waits for at the command line, against what the work itself costs.

Copies the bundled sample corpus and configuration into a temporary folder (its own embedded PostgreSQL), builds
the index once, then times whole `rag-pipeline` processes, median of --repeat runs each:

- `--version`, `--help`, `config show`: no work at all;
- a no-op `ingest`, against the stages' own seconds (the run's JSON summary);
- `ingest` after adding one Markdown file, against the no-op plus embedding that file's chunks with a loaded model;
- `search`, against the same search in a warm process (model loaded, SQL function warm); `eval` of the shipped
  golden set, against the same evaluation in a warm process; `search --service`, which
  asks a running `rag-pipeline serve` (no model, no database driver, no configuration loaded in the process), against
  the same and against the service's own round trip, beside a Python process that does nothing (the floor of any
  command);
- a no-op run launched as the UI launches it (`rag-pipeline ui`: the webserver and daemon of `dg dev`, a run
  submitted over GraphQL, queued, dequeued by the daemon and started in a process of its own), for the `ingest`
  job and for "Materialize all", against the CLI no-op: submit to success.

    .venv/bin/python -m bench.cli_latency [--repeat 3]

Run it on a quiet machine: these are wall times of whole processes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.common import REPO, machine

QUERY = "how much is the hotel allowance when travelling"
LABELS = "staff"
NEW_FILE = """# Parking at the Leeds site

Staff park in the north car park; visitors use the marked bays by reception. Bicycle racks are beside the
loading dock, and the charging points for electric cars are booked through the facilities desk.

## Out of hours

After 20:00 the barrier opens with a staff badge. Report a broken barrier to security on extension 4100.
"""


def _environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The commands' environment: the caller's RAG_* variables would point them elsewhere (another index, a running
    service). Bytecode is written, as a user's Python writes it: with PYTHONDONTWRITEBYTECODE set (some sandboxes
    and containers set it) every command would compile each edited module again, 0.3 s of a no-op; the untimed
    first build writes the caches."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith("RAG_") and k != "PYTHONDONTWRITEBYTECODE"}
    return {**kept, "HF_HUB_OFFLINE": "1", **(extra or {})}


def _cli(config: Path, *args: str, env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess]:
    env = _environment(env)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "rag_pipeline.cli", "--config", str(config), *args],
                          capture_output=True, text=True, env=env, timeout=1800)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"rag-pipeline {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed, done


def _median(config: Path, repeat: int, *args: str, env: dict[str, str] | None = None
            ) -> tuple[float, subprocess.CompletedProcess]:
    runs = [_cli(config, *args, env=env) for _ in range(repeat)]
    return statistics.median(t for t, _ in runs), runs[-1][1]


def _stage_seconds(done: subprocess.CompletedProcess) -> float:
    return sum(json.loads(done.stdout)["seconds"].values())


def _warm_search_seconds(config: Path, repeat: int) -> float:
    """One search in a process that already holds the model and has searched once."""
    from rag_pipeline.config import load_settings
    from rag_pipeline.lifecycle.prepare import prepare
    from rag_pipeline.retrieval.search import SearchOptions, search
    from rag_pipeline.store.database import connect, resolve_urls

    settings = load_settings(config)
    url = resolve_urls(settings).index
    prepare(url, settings)
    options = SearchOptions.from_settings(settings)
    with connect(url) as conn:
        search(conn, QUERY, [LABELS], options=options)  # loads the model
        times = []
        for _ in range(max(repeat, 5)):
            started = time.perf_counter()
            search(conn, QUERY, [LABELS], options=options)
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def _warm_eval_seconds(config: Path, repeat: int) -> tuple[float, int]:
    """The shipped golden set evaluated in a process that already holds the model and has evaluated it once."""
    from rag_pipeline.config import load_settings
    from rag_pipeline.lifecycle.prepare import prepare
    from rag_pipeline.retrieval.evaluation import evaluate, load_golden
    from rag_pipeline.retrieval.search import SearchOptions
    from rag_pipeline.store.database import connect, resolve_urls

    settings = load_settings(config)
    url = resolve_urls(settings).index
    prepare(url, settings)
    options = SearchOptions.from_settings(settings)
    questions = load_golden(Path(settings.checks.golden_set))
    labels = ",".join(settings.checks.golden_labels)
    with connect(url) as conn:
        evaluate(conn, questions, labels, k=settings.checks.k, options=options)  # loads the model
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            evaluate(conn, questions, labels, k=settings.checks.k, options=options)
            times.append(time.perf_counter() - started)
    return statistics.median(times), len(questions)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    """Ctrl-C to the process group (the server and what it started), then a kill if it has not ended in 60 s."""
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)


def _process_floor_seconds(repeat: int) -> float:
    """A Python process of this interpreter that does nothing: what any command costs before its first import."""
    times = []
    for _ in range(max(repeat, 5)):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _service_search_seconds(config: Path, repeat: int) -> tuple[float, float]:
    """A running `rag-pipeline serve`: `search --service` as whole processes, and the service's own warm round trip
    (one HTTP request from a process that is already running), medians."""
    import httpx

    port, token = _free_port(), "bench-token-" + "x" * 24
    env = {"RAG_SEARCH_TOKEN": token}
    service = subprocess.Popen([sys.executable, "-m", "rag_pipeline.cli", "--config", str(config), "serve", "--port",
                                str(port)], env=_environment(env),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:  # /readyz: the query model is loaded
            try:
                if httpx.get(f"{url}/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if service.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("rag-pipeline serve did not get ready within 300 s")
            time.sleep(0.5)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as client:
            client.post("/search", json={"query": QUERY})
            round_trips = []
            for _ in range(max(repeat, 5)):
                started = time.perf_counter()
                client.post("/search", json={"query": QUERY}).raise_for_status()
                round_trips.append(time.perf_counter() - started)
        wall, _ = _median(config, repeat, "search", QUERY, "--service", url, "--json", env=env)
        return wall, statistics.median(round_trips)
    finally:
        _stop(service)


def _ui_noop_seconds(config: Path, repeat: int) -> dict[str, float]:
    """Median submit-to-success seconds of a no-op run launched through the UI's own path, per job."""
    from dagster_graphql import DagsterGraphQLClient, DagsterGraphQLClientError

    port = _free_port()
    env = _environment()
    ui = subprocess.Popen([sys.executable, "-m", "rag_pipeline.cli", "--config", str(config), "ui", "--port",
                           str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True)
    try:
        client = DagsterGraphQLClient("127.0.0.1", port_number=port, timeout=30)

        def until_done(run_id: str) -> None:
            while (status := client.get_run_status(run_id).value) not in ("SUCCESS", "FAILURE", "CANCELED"):
                time.sleep(0.2)
            if status != "SUCCESS":
                raise SystemExit(f"UI-launched run {run_id} ended {status}")

        deadline = time.monotonic() + 300
        while True:  # until the webserver answers and the code location has loaded
            try:
                warm_up = client.submit_job_execution("ingest")
                break
            except Exception:  # noqa: BLE001 - not up yet (connection refused, location still loading)
                if ui.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("rag-pipeline ui did not come up within 300 s") from None
                time.sleep(1)
        until_done(warm_up)
        medians = {}
        for label, job in (("ingest job", "ingest"), ("Materialize all", "__ASSET_JOB")):
            times = []
            for _ in range(repeat):
                started = time.perf_counter()
                try:
                    run_id = client.submit_job_execution(job)
                except DagsterGraphQLClientError as exc:
                    raise SystemExit(f"could not launch {job}: {exc}") from exc
                until_done(run_id)
                times.append(time.perf_counter() - started)
            medians[label] = statistics.median(times)
        return medians
    finally:
        _stop(ui)


def _embed_seconds(config: Path, rel_path: str) -> tuple[float, int]:
    """Embedding the chunks the run wrote for `rel_path`, with the model already loaded."""
    from rag_pipeline import store
    from rag_pipeline.config import load_settings
    from rag_pipeline.domain import ids
    from rag_pipeline.embedding.embedders import get_embedder
    from rag_pipeline.store.database import connect, resolve_urls

    settings = load_settings(config)
    doc_id = ids.doc_id("sample", rel_path)
    with connect(resolve_urls(settings).index) as conn:
        chunks = store.chunks.chunks_of(conn, [doc_id])[doc_id]
    embedder = get_embedder(settings.embedding.backend_model, settings.embedding)
    texts = [f"{c.prefix}\n{c.text}" if c.prefix else c.text for c in chunks]
    embedder.embed_documents(texts)  # warm
    started = time.perf_counter()
    embedder.embed_documents(texts)
    return time.perf_counter() - started, len(texts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="ragbench-cli-"))
    config = workdir / "rag.yaml"
    try:
        corpus = workdir / "sample_corpus"
        shutil.copytree(REPO / "sample_corpus", corpus)
        # The shipped configuration, its relative paths made absolute (the file moves to the work folder).
        shipped = yaml.safe_load((REPO / "rag_pipeline.yaml").read_text())
        shipped["data_dir"] = str(workdir / "data")
        shipped["embedding"]["models_dir"] = str(REPO / ".models")
        shipped["checks"]["golden_set"] = str(REPO / shipped["checks"]["golden_set"])
        shipped["service"] = {"tokens": [{"name": "bench", "env": "RAG_SEARCH_TOKEN", "labels": [LABELS]}]}
        (source,) = shipped["sources"]
        source["root"] = str(corpus)
        config.write_text(yaml.safe_dump(shipped, sort_keys=False))
        print(f"machine: {machine()}")
        _cli(config, "db", "start")
        build, _ = _cli(config, "ingest", "--json")
        print(f"first build of the sample (not a target): {build:.1f} s")

        rows = []
        for label, command in (("--version", ("--version",)), ("--help", ("--help",)), ("config show", ("config", "show"))):
            seconds, _ = _median(config, args.repeat, *command)
            rows.append((label, seconds, None, "≤ 1 s"))
        noop, done = _median(config, args.repeat, "ingest", "--json")
        rows.append(("no-op ingest", noop, _stage_seconds(done), "≤ 3 s"))

        (corpus / "handbook" / "parking.md").write_text(NEW_FILE)
        one_file, done = _cli(config, "ingest", "--json")
        embed, chunks = _embed_seconds(config, "handbook/parking.md")
        rows.append((f"ingest of one new file ({chunks} chunks)", one_file, _stage_seconds(done),
                     f"≤ 2 × (embed {embed:.2f} s + no-op) = {2 * (embed + noop):.1f} s"))

        search_wall, _ = _median(config, args.repeat, "search", QUERY, "--labels", LABELS, "--json")
        warm = _warm_search_seconds(config, args.repeat)
        rows.append(("search", search_wall, warm, f"≤ 2 × warm search = {2 * warm:.2f} s"))
        eval_wall, _ = _median(config, args.repeat, "eval", "--json")
        warm_eval, questions = _warm_eval_seconds(config, args.repeat)
        rows.append((f"eval ({questions} golden questions)", eval_wall, warm_eval,
                     f"≤ 2 × warm eval = {2 * warm_eval:.2f} s"))
        service_wall, round_trip = _service_search_seconds(config, args.repeat)
        rows.append(("search --service (a running serve)", service_wall, warm, f"≤ 2 × warm search = {2 * warm:.2f} s"))
        rows.append(("  the service's own round trip (warm client)", round_trip, warm, ""))
        rows.append(("  a Python process that does nothing", _process_floor_seconds(args.repeat), None, ""))

        for label, seconds in _ui_noop_seconds(config, args.repeat).items():
            rows.append((f"UI-launched no-op: {label}", seconds, noop, f"≤ 1.5 × CLI no-op = {1.5 * noop:.1f} s"))

        print(f"\n| command (median of {args.repeat}) | wall s | its work s | ratio | target |")
        print("|---|---|---|---|---|")
        for label, wall, work, target in rows:
            ratio = f"{wall / work:.1f}×" if work else ""
            print(f"| {label} | {wall:.2f} | {'' if work is None else f'{work:.2f}'} | {ratio} | {target} |")
        print("\n'its work': the stages' own seconds for ingest (the run's summary), a search (the golden set) in a warm "
              "process for search (eval), the CLI no-op's wall time for UI-launched runs.")
    finally:
        if config.exists():
            subprocess.run([sys.executable, "-m", "rag_pipeline.cli", "--config", str(config), "db", "stop"],
                           capture_output=True, timeout=120)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
