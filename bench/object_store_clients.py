"""Which client lists a bucket: obstore (the one the pipeline uses) against boto3's paginator and s3fs, on the same
SeaweedFS bucket, each in a fresh process: wall time and peak memory of listing every key with its ETag and size.

s3fs is not a dependency of the project; give a Python that has it (a throwaway venv: `python -m venv /tmp/fs &&
/tmp/fs/bin/pip install s3fs`):

    .venv/bin/python -m bench.object_store_clients --objects 100000 --s3fs-python /tmp/fs/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import machine
from rag_pipeline_tests.object_servers import ADMIN, SeaweedS3Server

BUCKET = "clients"

# Each lister prints {"keys": n, "seconds": s, "peak_rss_mib": m}; it gets endpoint, key id, secret as arguments.
# Peak memory is VmHWM: ru_maxrss survives exec, so a child would report its parent's peak.
PEAK = """
def peak_rss_mib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
"""
LISTERS = {
    "obstore (S3Store, streamed pages)": """
import sys, time, json, obstore
from obstore.store import S3Store
store = S3Store("clients", config={"endpoint": sys.argv[1], "access_key_id": sys.argv[2],
    "secret_access_key": sys.argv[3], "region": "us-east-1"}, client_options={"allow_http": True})
t = time.perf_counter(); n = 0
for page in obstore.list(store, chunk_size=1000):
    for meta in page:
        n += 1; meta["e_tag"], meta["size"]
print(json.dumps({"keys": n, "seconds": time.perf_counter() - t,
                  "peak_rss_mib": peak_rss_mib()}))
""",
    "boto3 (list_objects_v2 paginator)": """
import sys, time, json, boto3
client = boto3.client("s3", endpoint_url=sys.argv[1], aws_access_key_id=sys.argv[2],
    aws_secret_access_key=sys.argv[3], region_name="us-east-1")
t = time.perf_counter(); n = 0
for page in client.get_paginator("list_objects_v2").paginate(Bucket="clients"):
    for item in page.get("Contents", []):
        n += 1; item["ETag"], item["Size"]
print(json.dumps({"keys": n, "seconds": time.perf_counter() - t,
                  "peak_rss_mib": peak_rss_mib()}))
""",
}
S3FS_LISTER = """
import sys, time, json, s3fs
fs = s3fs.S3FileSystem(key=sys.argv[2], secret=sys.argv[3], client_kwargs={"endpoint_url": sys.argv[1],
    "region_name": "us-east-1"}, use_listings_cache=False)
t = time.perf_counter()
found = fs.find("clients", detail=True)  # s3fs returns the whole listing at once
n = sum(1 for info in found.values() if info["type"] == "file" and (info["ETag"], info["size"]))
print(json.dumps({"keys": n, "seconds": time.perf_counter() - t,
                  "peak_rss_mib": peak_rss_mib()}))
"""


async def upload(server: SeaweedS3Server, count: int) -> None:
    import obstore

    store = server.store(BUCKET)
    limit = asyncio.Semaphore(64)

    async def put(index: int) -> None:
        async with limit:
            await obstore.put_async(store, f"k/{index // 1000:03d}/doc-{index:06d}.md", b"# note\n\nbody\n" * 8)

    await asyncio.gather(*(put(index) for index in range(count)))


def run(python: str, code: str, server: SeaweedS3Server) -> dict:
    answer = subprocess.run([python, "-c", PEAK + code, server.endpoint, ADMIN.access_key, ADMIN.secret_key],
                            capture_output=True, text=True, timeout=1800, check=True)
    return json.loads(answer.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--s3fs-python", help="a Python with s3fs installed (omit: s3fs is not measured)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="clients-") as workdir, SeaweedS3Server(Path(workdir)) as server:
        server.create_bucket(BUCKET)
        started = time.perf_counter()
        asyncio.run(upload(server, args.objects))
        print(f"uploaded {args.objects:,} objects in {time.perf_counter() - started:.1f} s", flush=True)
        listers = [(name, sys.executable, code) for name, code in LISTERS.items()]
        if args.s3fs_python:
            listers.append(("s3fs (find, detail=True)", args.s3fs_python, S3FS_LISTER))
        rows = []
        for name, python, code in listers:
            results = [run(python, code, server) for _ in range(args.repeat)]
            assert all(result["keys"] == args.objects for result in results), results
            seconds = sorted(result["seconds"] for result in results)[len(results) // 2]
            rows.append((name, seconds, max(result["peak_rss_mib"] for result in results)))
            print(f"  {name}: {seconds:.2f} s", flush=True)
    print(f"\n{machine()}\n{args.objects:,} keys in one SeaweedFS bucket on 127.0.0.1, median of {args.repeat}, each "
          "in a fresh process\n")
    print("| client | listing | peak RSS of the process |\n|---|---|---|")
    for name, seconds, rss in rows:
        print(f"| {name} | {seconds:.2f} s | {rss:.0f} MiB |")


if __name__ == "__main__":
    main()
