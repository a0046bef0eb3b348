"""Load on the search service: `rag-pipeline serve` started as its own process on 127.0.0.1, searched by 1, 8 and
32 concurrent clients, each level bounded by a request count and a time limit.

    .venv/bin/python -m bench.service_load [--docs 300] [--requests 300] [--seconds 60] [--mode hybrid]

The index is `--docs` generated documents (about 5 chunks each) ingested by the pipeline; queries are 2-6 words of
its vocabulary. Latency is the client's (HTTP, token check, query embedding, the SQL ranking, JSON); errors are
non-200 answers and failed connections.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import secrets
import statistics
import subprocess
import sys
import threading
import time

import httpx
import yaml
from dagster import DagsterInstance

from bench.common import WORDS, generate_documents, machine, throwaway_database
from rag_pipeline.config import load_settings
from rag_pipeline.defs.runs import run_ingest


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def load(url: str, token: str, clients: int, requests: int, seconds: float, mode: str) -> dict[str, float]:
    """`requests` searches shared by `clients` threads, stopped after `seconds`."""
    rng = random.Random(clients)
    queries = [" ".join(rng.choices(WORDS, k=rng.randint(2, 6))) for _ in range(requests)]
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()
    deadline = time.monotonic() + seconds
    next_query = iter(queries)

    def client() -> None:
        nonlocal errors
        with httpx.Client(base_url=url, timeout=60, headers={"Authorization": f"Bearer {token}"}) as http:
            while time.monotonic() < deadline:
                with lock:
                    query = next(next_query, None)
                if query is None:
                    return
                started = time.perf_counter()
                try:
                    ok = http.post("/search", json={"query": query, "k": 10, "mode": mode}).status_code == 200
                except httpx.HTTPError:
                    ok = False
                elapsed = (time.perf_counter() - started) * 1000
                with lock:
                    latencies.append(elapsed)
                    errors += not ok

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    return {"clients": clients, "requests": len(latencies), "errors": errors, "p50": percentile(latencies, 0.5),
            "p95": percentile(latencies, 0.95), "p99": percentile(latencies, 0.99),
            "mean": statistics.fmean(latencies), "per_second": len(latencies) / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--requests", type=int, default=300, help="per concurrency level")
    parser.add_argument("--seconds", type=float, default=60, help="per concurrency level, at most")
    parser.add_argument("--clients", default="1,8,32")
    parser.add_argument("--mode", choices=["hybrid", "dense", "sparse"], default="hybrid")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    token = secrets.token_urlsafe(32)
    with throwaway_database() as database:
        url = database.create("service_load")
        corpus = database.workdir / "corpus"
        generate_documents(corpus, args.docs)
        config = database.workdir / "rag_pipeline.yaml"
        config.write_text(yaml.safe_dump({
            "database_url": url, "data_dir": str(database.workdir / "data"),
            "sources": [{"name": "generated", "root": str(corpus), "acl_labels": ["staff"]}],
            "service": {"host": "127.0.0.1", "port": args.port,
                        "tokens": [{"name": "load", "sha256": hashlib.sha256(token.encode()).hexdigest(),
                                    "labels": ["staff"]}]},
        }))
        settings = load_settings(config)
        with DagsterInstance.ephemeral() as instance:
            summary = run_ingest(settings, instance=instance)
        assert summary["success"], summary.get("errors")
        print(f"indexed {args.docs} documents ({summary.get('chunks_written')} chunks)", flush=True)
        server = subprocess.Popen([sys.executable, "-m", "rag_pipeline.cli", "--config", str(config), "serve"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1"})
        base = f"http://127.0.0.1:{args.port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"the service did not start: {server.stderr.read() if server.stderr else ''}")
                time.sleep(0.5)
            load(base, token, 1, 5, 30, args.mode)  # the query model loads on the first search
            rows = [load(base, token, int(c), args.requests, args.seconds, args.mode) for c in args.clients.split(",")]
        finally:
            server.terminate()
            server.wait(30)
    print(f"\n{machine()}; mode {args.mode}, k = 10, {args.docs} documents\n")
    print("| clients | requests | errors | p50 ms | p95 ms | p99 ms | requests/s |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['clients']} | {row['requests']} | {row['errors']} | {row['p50']:.1f} | {row['p95']:.1f} | "
              f"{row['p99']:.1f} | {row['per_second']:.1f} |")


if __name__ == "__main__":
    main()
