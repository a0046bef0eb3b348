"""The default install resolves without CUDA: what `pip install 'dagster-rag-pipeline[pipeline,...]'` would install
from the public package index alone, with no local wheel folder or pip configuration of this machine, holds no
torch, triton, nvidia-* or cuda-* package.

    .venv/bin/python scripts/check_cpu_install.py [--extras pipeline,embedded-db,serve,ocr] [--sizes]

`--sizes` adds the download size of what would be installed (a HEAD request per file). Needs the public index
(https://pypi.org/simple): it is the check that a machine configured with CPU wheels of its own cannot make.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_EXTRAS = "pipeline,embedded-db,serve,ocr"
GPU_PACKAGES = re.compile(r"(torch|triton|nvidia-.*|cuda-.*|pytorch-triton.*)")


def resolve(extras: str, index_url: str) -> list[dict]:
    """What pip would install for the checkout with `extras`, from `index_url` alone (pip's --report)."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "report.json"
        # --isolated: no pip configuration file and no PIP_* variable of this machine (its find-links, its indexes)
        environment = {name: value for name, value in os.environ.items() if not name.startswith("PIP_")}
        subprocess.run([sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--ignore-installed",
                        "--quiet", "--index-url", index_url, "--report", str(report), f"{REPO}[{extras}]"],
                       check=True, env=environment, cwd=folder)
        return json.loads(report.read_text())["install"]


def download_bytes(items: list[dict]) -> int:
    import httpx

    total = 0
    with httpx.Client(timeout=30, follow_redirects=True) as client:
        for item in items:
            url = item["download_info"]["url"]
            if url.startswith("http"):
                total += int(client.head(url).headers.get("content-length", 0))
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extras", default=DEFAULT_EXTRAS)
    parser.add_argument("--index-url", default="https://pypi.org/simple")
    parser.add_argument("--sizes", action="store_true", help="also sum the download sizes (HEAD requests)")
    args = parser.parse_args(argv)
    items = resolve(args.extras, args.index_url)
    names = sorted(item["metadata"]["name"].lower() for item in items)
    gpu = [name for name in names if GPU_PACKAGES.fullmatch(name)]
    line = f"[{args.extras}] from {args.index_url}: {len(names)} packages"
    if args.sizes:
        line += f", {download_bytes(items) / 2**20:,.0f} MiB to download"
    print(line)
    if gpu:
        print(f"FAIL: the install would bring {', '.join(gpu)}", file=sys.stderr)
        return 1
    print("no torch, triton, nvidia-* or cuda-* package")
    return 0


if __name__ == "__main__":
    sys.exit(main())
