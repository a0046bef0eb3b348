"""Issue 47, cases 4 and 6, on the release before them (b988343): a password in an object store's endpoint_url
was printed by the CLI and kept in Dagster's event log and compute logs when the scan failed, `config show` printed
the database password, and a key written twice (in a sidecar, in rag_pipeline.yaml) silently took the last value,
so `["hr"]` then `["staff"]` gave {staff}."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import yaml
from dagster import DagsterInstance
from dagster._serdes import serialize_value

from rag_pipeline.cli import main
from rag_pipeline.config import ConfigError, load_settings
from rag_pipeline.stages.discover import discover
from rag_pipeline_tests.conftest import MODELS_DIR
from rag_pipeline_tests.object_servers import ADMIN, SeaweedS3Server

OBJECT_STORE_PASSWORD = "Endpoint-Pa55-7781"
DATABASE_PASSWORD = "Db-Pa55-4412"


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_redact_credentials_masks_every_form_a_url_or_connection_string_carries():
    from rag_pipeline.endpoints.redaction import redact_credentials

    cases = {
        "GET http://scanner:Pa55w0rd@127.0.0.1:9/x?list-type=2 failed": "GET http://127.0.0.1:9/x?list-type=2 failed",
        "postgresql://rag:Pa55w0rd@db:5432/rag?sslmode=require": "postgresql://db:5432/rag?sslmode=require",
        "postgresql://db/rag?password=Pa55w0rd&sslmode=require": "postgresql://db/rag?password=***&sslmode=require",
        "host=db user=rag password=Pa55w0rd dbname=rag": "host=db user=rag password=*** dbname=rag",
        "host=db password='Pa55 w0rd' dbname=rag": "host=db password='***' dbname=rag",
        "https://a.blob.core.windows.net/c/b?sv=2022&sig=Pa55w0rd%3D": "https://a.blob.core.windows.net/c/b?sv=2022&sig=***",
        "https://b.s3.amazonaws.com/k?X-Amz-Signature=Pa55w0rd&X-Amz-Date=1":
            "https://b.s3.amazonaws.com/k?X-Amz-Signature=***&X-Amz-Date=1",
        "https://api.example.org/v1?token=Pa55w0rd#top": "https://api.example.org/v1?token=***#top",
        "https://api.example.org/v1?key=Pa55w0rd&q=1": "https://api.example.org/v1?key=***&q=1",
        "SourceConfig(password='Pa55w0rd', api_key=\"Pa55w0rd\")": "SourceConfig(password='***', api_key=\"***\")",
        '{"password": "Pa55w0rd", "user": "rag"}': '{"password": "***", "user": "rag"}',
        "Authorization: Bearer Pa55w0rd": "Authorization: ***",
        "http://user:Pa55@w0rd@host:1/x": "http://host:1/x",  # an @ the user forgot to escape
        # What is not a credential stays: an object's key, a variable's name.
        "key=a/b.md skipped; password_env=RAG_PW": "key=a/b.md skipped; password_env=RAG_PW",
    }
    for text, expected in cases.items():
        assert redact_credentials(text) == expected, text


def test_a_password_in_an_endpoint_url_never_leaves_the_process(tmp_path, db_url):
    """An S3 source whose endpoint_url carries user:password, on a closed port: the scan fails. Neither the CLI's
    output, nor the run's events in Dagster's storage, nor the compute logs under DAGSTER_HOME hold the password;
    where the scan went (host and port) is still said."""
    port = _closed_port()
    config = {
        "database_url": db_url, "data_dir": str(tmp_path / "data"), "embedding": {"models_dir": str(MODELS_DIR)},
        "sources": [{"name": "bucket", "root": "s3://docs/reports/", "acl_labels": ["staff"],
                     "endpoint_url": f"http://scanner:{OBJECT_STORE_PASSWORD}@127.0.0.1:{port}", "allow_http": True,
                     "region": "us-east-1", "max_retries": 0, "request_timeout_seconds": 5,
                     "credentials_env": {"access_key_id": "TEST_S3_READER_ID",
                                         "secret_access_key": "TEST_S3_READER_SECRET"}}],
    }
    path = tmp_path / "rag_pipeline.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {name: value for name, value in os.environ.items() if name != "DAGSTER_HOME"}
    ran = subprocess.run([sys.executable, "-m", "rag_pipeline.cli", "--config", str(path), "ingest"], env=env,
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    printed = ran.stdout + ran.stderr
    assert f"127.0.0.1:{port}" in printed and "scan failed" in printed, printed[-3000:]
    assert OBJECT_STORE_PASSWORD not in printed

    home = tmp_path / "data" / "dagster_home"
    os.environ["DAGSTER_HOME"] = str(home)
    try:
        with DagsterInstance.get() as instance:
            (run,) = instance.get_runs()
            events = "\n".join(serialize_value(entry) for entry in instance.all_logs(run.run_id))
    finally:
        del os.environ["DAGSTER_HOME"]
    assert f"127.0.0.1:{port}" in events  # the scan's problem, in the run's metadata and log
    assert OBJECT_STORE_PASSWORD not in events

    compute_logs = [p for p in (home / "storage").rglob("*") if p.is_file()]
    written = "\n".join(p.read_text(errors="replace") for p in compute_logs)
    assert "scan failed" in written  # the step's output was captured
    assert OBJECT_STORE_PASSWORD not in written


def test_a_scan_error_is_reported_without_the_endpoints_password(db_url):
    from rag_pipeline.config import SourceConfig

    port = _closed_port()
    source = SourceConfig(name="bucket", root="s3://docs/reports/", acl_labels=["staff"], allow_http=True,
                          endpoint_url=f"http://scanner:{OBJECT_STORE_PASSWORD}@127.0.0.1:{port}", max_retries=0,
                          region="us-east-1", credentials_env={"access_key_id": "TEST_S3_READER_ID",
                                                               "secret_access_key": "TEST_S3_READER_SECRET"})
    lines: list[str] = []
    stats = discover(db_url, [source], progress=lines.append)
    reported = json.dumps(stats.problems) + "\n".join(lines)
    assert "scan failed" in reported and f"127.0.0.1:{port}" in reported
    assert OBJECT_STORE_PASSWORD not in reported


def test_config_show_masks_the_database_password(tmp_path, capsys, monkeypatch):
    path = tmp_path / "rag_pipeline.yaml"
    path.write_text(yaml.safe_dump({"database_url": f"postgresql://rag:{DATABASE_PASSWORD}@127.0.0.1:5432/rag",
                                    "data_dir": str(tmp_path / "data")}))
    # A libpq connection string from the environment, as RAG_DAGSTER_DATABASE_URL may be written.
    monkeypatch.setenv("RAG_DAGSTER_DATABASE_URL", f"host=127.0.0.1 dbname=dagster password={DATABASE_PASSWORD}x")
    assert main(["--config", str(path), "config", "show"]) == 0
    shown = capsys.readouterr().out
    assert DATABASE_PASSWORD not in shown
    settings = json.loads(shown.split("\n", 1)[1])
    assert settings["database_url"] == "postgresql://127.0.0.1:5432/rag"
    assert settings["dagster_database_url"] == "host=127.0.0.1 dbname=dagster password=***"


SALARY = "# Executive salaries\n\nThe executive salary of the chief financial officer is 410,000 euros a year.\n"
CANTEEN = "# Canteen\n\nThe canteen serves lunch from noon.\n"


def test_a_sidecar_that_names_a_key_twice_holds_what_it_speaks_for(db_url, db, tmp_path):
    """`acl_labels` twice (["hr"] then ["staff"]) read as {staff} before; now the folder's files are held with
    the reason, as for any sidecar that cannot be read. A file's own sidecar holds its file, at any depth."""
    from rag_pipeline.config import SourceConfig

    root = tmp_path / "docs"
    (root / "hr").mkdir(parents=True)
    (root / "public").mkdir()
    (root / "hr" / "salaries.md").write_text(SALARY)
    (root / "hr" / "_meta.json").write_text('{"acl_labels": ["hr"], "owner": "payroll", "acl_labels": ["staff"]}')
    (root / "public" / "canteen.md").write_text(CANTEEN)
    (root / "public" / "memo.md").write_text("# Memo\n\nThe salary review is in March.\n")
    (root / "public" / "memo.md.meta.json").write_text(
        '{"acl_labels": ["board"], "review": {"due": "March", "due": "never"}}')
    stats = discover(db_url, [SourceConfig(name="docs", root=str(root), acl_labels=["staff"])])
    rows = {path: (status, labels, reason) for path, status, labels, reason in db.execute(
        "SELECT rel_path, status, acl_labels, held_reason FROM documents")}
    status, labels, reason = rows["hr/salaries.md"]
    assert status == "held_bad_sidecar" and "acl_labels" in reason and "more than once" in reason, rows
    status, _, reason = rows["public/memo.md"]
    assert status == "held_bad_sidecar" and '"due"' in reason, rows
    assert rows["public/canteen.md"][0] != "held_bad_sidecar" and stats.held == 2



def test_an_object_stores_sidecar_that_names_a_key_twice_holds_what_it_speaks_for(db_url, db, tmp_path, monkeypatch):
    from rag_pipeline.config import SourceConfig

    with SeaweedS3Server(tmp_path / "s3") as server:
        server.create_bucket("docs")
        server.put_object("docs", "p/hr/salaries.md", SALARY.encode())
        server.put_object("docs", "p/hr/_meta.json", b'{"acl_labels": ["hr"], "acl_labels": ["staff"]}')
        server.put_object("docs", "p/memo.md", b"# Memo\n\nThe salary review is in March.\n")
        server.put_object("docs", "p/memo.md.meta.json", b'{"acl_labels": ["board"], "acl_labels": ["staff"]}')
        server.put_object("docs", "p/canteen.md", CANTEEN.encode())
        monkeypatch.setenv("TEST_DUPLICATES_S3_ID", ADMIN.access_key)
        monkeypatch.setenv("TEST_DUPLICATES_S3_SECRET", ADMIN.secret_key)
        source = SourceConfig(name="bucket", root="s3://docs/p/", acl_labels=["staff"], endpoint_url=server.endpoint,
                              allow_http=True, region=server.region,
                              credentials_env={"access_key_id": "TEST_DUPLICATES_S3_ID",
                                               "secret_access_key": "TEST_DUPLICATES_S3_SECRET"})
        discover(db_url, [source])
    rows = dict(db.execute("SELECT rel_path, status FROM documents").fetchall())
    assert rows == {"hr/salaries.md": "held_bad_sidecar", "memo.md": "held_bad_sidecar",
                    "canteen.md": "pending_parse"}


DUPLICATED_CONFIGURATIONS = {
    "a source's labels": ("sources:\n  - name: docs\n    root: {root}\n    acl_labels: [hr]\n"
                          "    acl_labels: [staff]\n", "sources[0].acl_labels", (4, 5)),
    "a token's labels": ("service:\n  tokens:\n    - name: app\n      sha256: " + "a" * 64 + "\n"
                         "      labels: [hr]\n      labels: [staff]\n", "service.tokens[0].labels", (5, 6)),
    "a second sources list": ("sources:\n  - name: docs\n    root: {root}\n    acl_labels: [hr]\n"
                              "data_dir: {root}\nsources:\n  - name: all\n    root: {root}\n    acl_labels: [staff]\n",
                              "sources", (1, 6)),
}


@pytest.mark.parametrize("case", list(DUPLICATED_CONFIGURATIONS))
def test_a_configuration_that_names_a_key_twice_is_refused_with_both_lines(case, tmp_path, capsys):
    text, key, (first, second) = DUPLICATED_CONFIGURATIONS[case]
    path = tmp_path / "rag_pipeline.yaml"
    path.write_text(text.format(root=tmp_path))
    with pytest.raises(ConfigError) as refused:
        load_settings(path)
    assert f"{key}: key given twice" in str(refused.value)
    assert f"lines {first} and {second}" in str(refused.value)
    assert main(["--config", str(path), "config", "show"]) == 2
    said = capsys.readouterr()
    assert said.out == "" and f"{key}: key given twice in one mapping (lines {first} and {second})" in said.err

    # A YAML merge (`<<: *anchor`) is no duplicate: its keys may be overridden one by one, as YAML means.
    path.write_text(f"sources:\n  - &docs\n    name: docs\n    root: {tmp_path}\n    acl_labels: [staff]\n"
                    "  - <<: *docs\n    name: hr\n    acl_labels: [hr]\n")
    assert [(s.name, s.acl_labels) for s in load_settings(path).sources] == [("docs", ("staff",)), ("hr", ("hr",))]

