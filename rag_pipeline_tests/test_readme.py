"""The README's code blocks, read from the README itself so they cannot drift: the application examples run as
written on the bundled sample (SQL, Python, the service and its retriever), the configuration blocks load, every
command line names a real command, and the module map names files that exist. A block of a kind this module does
not know fails the first test: a new block needs a way to be checked."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import yaml

from rag_pipeline.cli import build_parser
from rag_pipeline.config import ENV_OVERRIDES, load_settings

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
FENCE_RE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int

    def __str__(self) -> str:
        return f"README.md:{self.line} ({self.language or 'plain'})"


def readme_blocks() -> list[Block]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    return [Block(m.group(1), m.group(2), readme.count("\n", 0, m.start()) + 1) for m in FENCE_RE.finditer(readme)]


def the_block(language: str, marker: str) -> Block:
    (found,) = [b for b in readme_blocks() if b.language == language and marker in b.text]
    return found


# Each block is one of these kinds, told apart by what it holds.
APPLICATION_MARKERS = {"sql": "CREATE ROLE support_bot", "python": "rag.search(%s", "service": "rag-pipeline serve &",
                       "retrievers": "RagPipelineRetriever"}


def kind_of(block: Block) -> str:
    if block.language == "sql" and APPLICATION_MARKERS["sql"] in block.text:
        return "application"
    if block.language == "python" and any(APPLICATION_MARKERS[k] in block.text for k in ("python", "retrievers")):
        return "application"
    if block.language == "bash" and APPLICATION_MARKERS["service"] in block.text:
        return "application"
    if block.language == "yaml":
        return "configuration"
    if block.language == "bash":
        return "commands"
    if block.language == "" and block.text.startswith("rag_pipeline/"):
        return "module map"
    if block.language == "" and "──▶" in block.text:
        return "diagram"
    return "unknown"


def test_every_readme_block_is_of_a_kind_these_tests_check():
    kinds = {str(b): kind_of(b) for b in readme_blocks()}
    assert [b for b, k in kinds.items() if k == "unknown"] == []
    assert list(kinds.values()).count("application") == 4, kinds


def test_the_readme_configuration_blocks_load(tmp_path):
    for block in (b for b in readme_blocks() if kind_of(b) == "configuration"):
        path = tmp_path / "rag_pipeline.yaml"
        path.write_text(block.text)
        settings = load_settings(path)  # raises ConfigError naming the key a block gets wrong
        assert settings.config_file == path, block


def _command_lines(block: Block) -> list[list[str]]:
    """Each command of a bash block, comments and continuations joined, `a|b` alternatives and [optional]
    parts of a synopsis reduced to the first alternative and dropped."""
    text = re.sub(r"\\\n\s*", " ", block.text)
    commands = []
    for line in text.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        for part in re.split(r"\s*&&\s*", line):
            if part:
                commands.append(part)
    return [shlex.split(re.sub(r"\[[^\]]*\]", "", re.sub(r"(\w+)(\|[\w-]+)+", r"\1", c))) for c in commands]


def test_the_readme_command_lines_name_real_commands_and_variables():
    parser = build_parser()
    subcommands = {a.dest: a for a in parser._subparsers._group_actions}  # noqa: SLF001 - argparse has no public view
    (commands,) = subcommands.values()
    make_targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    checked = 0
    for block in (b for b in readme_blocks() if kind_of(b) in ("commands", "application") and b.language == "bash"):
        for words in _command_lines(block):
            if words[0] == "make":
                assert words[1] in make_targets, (block, words)
            elif words[0] == "export":
                name = words[1].split("=", 1)[0]
                assert name in ENV_OVERRIDES or name == "RAG_SEARCH_TOKEN", (block, name)
            elif words[0] == "rag-pipeline":
                assert words[1] in commands.choices, (block, words)
                nested = commands.choices[words[1]]._subparsers  # noqa: SLF001
                if nested is not None and len(words) > 2 and not words[2].startswith("-"):
                    (choices,) = [a.choices for a in nested._group_actions]  # noqa: SLF001
                    assert words[2] in choices, (block, words)
            checked += 1
    assert checked >= 25


def test_the_readme_says_the_highest_rank_score_the_default_ranking_gives():
    """The README's ceiling of a hit's score: each fused list's first hit adds weight / (rrf_k + 1), from the dense
    and BM25 lists and, when the query names a document, their routed twins."""
    retrieval = load_settings(REPO / "rag_pipeline.yaml").retrieval
    ceiling = (retrieval.dense_weight + retrieval.sparse_weight) * (1 + retrieval.document_routing.weight) / (
        retrieval.rrf_k + 1)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    said = re.search(r"the fused RRF value, up to (\d\.\d+) with the default weights", readme)
    assert said and abs(float(said.group(1)) - ceiling) < 0.0005, (said and said.group(1), ceiling)


def test_the_readme_module_map_names_files_that_exist():
    (block,) = [b for b in readme_blocks() if kind_of(b) == "module map"]
    entries: dict[str, str] = {}  # path -> its description, continuation lines included
    last = ""
    for line in block.text.splitlines():
        if line.startswith(" " * 20):  # a description's continuation
            entries[last] += " " + line.strip()
        elif line.strip():
            names, _, description = line.strip().partition("  ")
            for last in (name.strip() for name in names.split(",")):
                entries[last] = description.strip()
    assert [path for path in entries if not (REPO / path).exists()] == []
    # Every module of the package is on the map: by its path, or by its name on its folder's line.
    unmapped = [p for p in (REPO / "rag_pipeline").rglob("*.py")
                if p.name != "__init__.py" and {"integrations", "vocabularies"}.isdisjoint(p.parts)
                and p.relative_to(REPO).as_posix() not in entries
                and p.name not in entries.get(p.parent.relative_to(REPO).as_posix() + "/", "")]
    assert unmapped == [], "modules missing from the README's module map"


# --- the application examples, run as written against an ingest of the bundled sample ----------------------------


def _port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def support_bot(clone):
    """The SQL block run as the README says: its first part as the database owner, the rest as support_bot."""
    conn, settings = clone
    block = the_block("sql", APPLICATION_MARKERS["sql"])
    owner_part, role_part = block.text.split("-- as support_bot", 1)
    conn.execute("DROP ROLE IF EXISTS support_bot")
    conn.execute(owner_part)
    url = psycopg.conninfo.make_conninfo(conn.info.dsn, user="support_bot", password="change-me")
    yield url, "-- as support_bot" + role_part, settings
    conn.execute("DROP OWNED BY support_bot")
    conn.execute("DROP ROLE support_bot")


def test_db_psql_passes_the_password_in_the_environment_not_on_the_command_line(tmp_path, monkeypatch):
    """Any local user can read a process's command line: the password of the URL goes to psql as PGPASSWORD."""
    from rag_pipeline.store import database

    fake = tmp_path / "psql"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$(dirname "$0")/argv"\nprintf "%s" "$PGPASSWORD" > '
                    '"$(dirname "$0")/password"\nexit 3\n')
    fake.chmod(0o755)
    monkeypatch.setattr(database, "psql_binary", lambda: str(fake))
    code = database.run_psql("postgresql://owner:s3cret-pw@db.example:5433/rag", ["-c", "SELECT 1"])
    argv = (tmp_path / "argv").read_text()
    assert code == 3 and "s3cret-pw" not in argv and (tmp_path / "password").read_text() == "s3cret-pw"
    assert "host=db.example" in argv and "port=5433" in argv and "user=owner" in argv and "-c\nSELECT 1" in argv


def test_the_readme_sql_and_python_examples_find_the_travel_policy(support_bot):
    url, role_sql, settings = support_bot
    cli = [str(BIN / "rag-pipeline"), "--config", str(settings.config_file), "db"]
    # `db psql`, where the SQL block says the owner's part is run: psql on the index database, from the venv
    opened = subprocess.run([*cli, "psql", "--", "-tAc", "SELECT current_database()"], capture_output=True, text=True,
                            timeout=120)
    assert opened.returncode == 0 and opened.stdout.strip() == psycopg.conninfo.conninfo_to_dict(url)["dbname"], \
        opened.stderr
    with psycopg.connect(url) as app:
        rows = app.execute(role_sql).fetchall()
    assert rows and rows[0][0] == "handbook/travel-policy.md", rows

    block = the_block("python", APPLICATION_MARKERS["python"])
    # The URL as the README has the reader get it: the CLI's, as support_bot (the password from PGPASSWORD).
    told = subprocess.run([*cli, "url", "--user", "support_bot"], capture_output=True, text=True, timeout=120,
                          check=True).stdout.strip()
    expected, given = psycopg.conninfo.conninfo_to_dict(url), psycopg.conninfo.conninfo_to_dict(told)
    assert "password" not in given and all(given.get(key) == expected.get(key)
                                           for key in ("user", "dbname", "host", "port")), told
    done = subprocess.run([sys.executable, "-c", block.text], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "RAG_APP_URL": told, "PGPASSWORD": "change-me", "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "handbook/travel-policy.md"
    assert "# handbook/travel-policy.md" in block.text  # what the README says it prints


def test_the_readme_service_example_and_its_retrievers_run_as_written(clone, tmp_path):
    if shutil.which("curl") is None:  # the block calls the service with curl
        if os.environ.get("CI") == "true":
            pytest.fail("curl is not installed: .ci/run installs it")
        pytest.skip("curl is not installed (apt-get install curl): the README's service example calls it")
    _, settings = clone
    config = yaml.safe_load(settings.config_file.read_text())
    config.update(yaml.safe_load(the_block("yaml", "tokens:").text))
    script = the_block("bash", APPLICATION_MARKERS["service"]).text
    # The block as written, then the retrievers' block in the same shell (it reads the token the block exported).
    retrievers = the_block("python", APPLICATION_MARKERS["retrievers"]).text
    port = config["service"]["port"]
    assert f"127.0.0.1:{port}" in script and f"127.0.0.1:{port}" in retrievers
    if not _port_is_free(port):  # the README's port is taken on this machine: the same blocks on a free one
        free = _free_port()
        config["service"]["port"] = free
        script, retrievers = (text.replace(f"127.0.0.1:{port}", f"127.0.0.1:{free}") for text in (script, retrievers))
    config_file = tmp_path / "rag_pipeline.yaml"
    config_file.write_text(yaml.safe_dump(config))
    check = (f"\nprintf '\\n'\n{shlex.quote(sys.executable)} - <<'PY'\nimport json\n{retrievers}\n"
             "print(json.dumps([docs[0].metadata['path'], nodes[0].metadata['path']]))\nPY\n")
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAG_")}, "RAG_CONFIG": str(config_file),
           "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "HF_HUB_OFFLINE": "1"}
    # Output to files: the service the block starts in the background keeps them open after the shell ends.
    out_file, err_file = tmp_path / "out.txt", tmp_path / "err.txt"
    with out_file.open("w") as out, err_file.open("w") as err:
        shell = subprocess.Popen(["bash", "-c", "set -e\n" + script + check], stdout=out, stderr=err, text=True,
                                 env=env, cwd=tmp_path, start_new_session=True)
        try:
            code = shell.wait(timeout=300)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGTERM)  # the service the block started in the background
            time.sleep(1)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell.pid, signal.SIGKILL)
    printed = out_file.read_text().splitlines()  # the service's access log lines come in between
    assert code == 0, err_file.read_text()[-3000:] + "\n".join(printed)[-3000:]
    response = json.loads(next(line for line in printed if line.startswith('{"results"')))
    assert response["results"][0]["path"] == "handbook/travel-policy.md", response
    assert 0 < response["results"][0]["similarity"] <= 1
    paths = json.loads([line for line in printed if line.startswith('["')][-1])
    assert paths == ["handbook/travel-policy.md", "handbook/travel-policy.md"]


def test_the_object_store_try_it_locally_block_indexes_the_sample_from_s3(tmp_path):
    """docs/sources.md's "Try it locally": SeaweedFS started by scripts/dev_s3.py, the sample corpus uploaded,
    ingested from s3:// and searched, as written (on a free port if 8333 is taken), from a copy of the checkout's
    layout (the block's relative paths: .venv, scripts, sample_corpus)."""
    sources_md = (REPO / "docs" / "sources.md").read_text(encoding="utf-8")
    (script,) = [m.group(2) for m in FENCE_RE.finditer(sources_md) if "scripts/dev_s3.py" in m.group(2)]
    if not _port_is_free(8333):
        script = script.replace("8333", str(_free_port()))
    for name in (".venv", "scripts", "sample_corpus", "rag_pipeline_tests"):
        (tmp_path / name).symlink_to(REPO / name)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("RAG_", "AWS_"))}, "HF_HUB_OFFLINE": "1",
           "RAG_MODELS_DIR": str(REPO / ".models")}
    shell = subprocess.Popen(["bash", "-c", "set -e\n" + script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, cwd=tmp_path, start_new_session=True)
    try:
        stdout, stderr = shell.communicate(timeout=600)
    finally:  # on a failure, SeaweedFS and the script stop with the shell's group; the data's Postgres is stopped
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGTERM)
        subprocess.run([str(BIN / "rag-pipeline"), "--config", str(tmp_path / "s3-demo" / "rag_pipeline.yaml"), "db",
                        "stop"], capture_output=True, env=env, cwd=tmp_path, timeout=120)
    done = subprocess.CompletedProcess(shell.args, shell.returncode, stdout, stderr)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    first_hit = next((line for line in done.stdout.splitlines() if line.startswith(" 1. ")), "")
    assert "devs3:handbook/travel-policy.md" in first_hit, done.stdout[-2000:]
    assert not (tmp_path / ".dev_s3" / "ready").exists()  # the server stopped with the script
