"""Alerts (log, webhook, SMTP against real receivers on 127.0.0.1), the source sensor, the alert sensor,
the schedules, and the index write lock that keeps two refreshes from writing at once."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from email import message_from_bytes
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dagster as dg
import psycopg
import pytest
import yaml
from aiosmtpd.controller import Controller
from psycopg import sql

from rag_pipeline import store
from rag_pipeline.config import AlertsConfig, ConfigError, SmtpConfig
from rag_pipeline.defs.code_location import build_definitions
from rag_pipeline.defs.resources import RagResource
from rag_pipeline.defs.runs import prepare_dagster_home
from rag_pipeline.lifecycle.alerts import Alert, AlertSender, Observation, transitions
from rag_pipeline.stages.discover import discover
from rag_pipeline.stages.process import process_pending
from rag_pipeline.store.database import IndexLockTimeout, index_write_lock

# --- receivers -------------------------------------------------------------------------------------------


class WebhookReceiver:
    """An HTTP server on 127.0.0.1 that records JSON POSTs; `fail_next` makes it answer 500 first."""

    def __init__(self) -> None:
        self.received: list[dict] = []
        self.received_at: list[float] = []
        self.fail_next = 0
        self.failure_headers: dict[str, str] = {}
        self.status_for_failures = 500
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if receiver.fail_next:
                    receiver.fail_next -= 1
                    self.send_response(receiver.status_for_failures)
                    for name, value in receiver.failure_headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    return
                receiver.received.append(json.loads(body))
                receiver.received_at.append(time.monotonic())
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/rag"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class MailSink:
    def __init__(self) -> None:
        self.messages: list = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's naming)
        self.messages.append((envelope.rcpt_tos, message_from_bytes(envelope.content)))
        return "250 OK"


@pytest.fixture
def webhook():
    receiver = WebhookReceiver()
    yield receiver
    receiver.close()


@pytest.fixture
def smtp():
    sink = MailSink()
    with socket.socket() as probe:  # aiosmtpd connects to its own port on start: it must be known up front
        probe.bind(("127.0.0.1", 0))
        sink.port = probe.getsockname()[1]
    controller = Controller(sink, hostname="127.0.0.1", port=sink.port)
    controller.start()
    yield sink
    controller.stop()


def _alerts_config(webhook, smtp) -> dict:
    return {"webhook_url": webhook.url, "ui_base_url": "http://127.0.0.1:3000",
            "smtp": {"host": "127.0.0.1", "port": smtp.port, "sender": "rag@example.org",
                     "recipients": ["oncall@example.org", "data@example.org"]}}


# --- alerts as plain functions ---------------------------------------------------------------------------


def test_transitions_alert_once_when_failing_and_once_on_recovery():
    failing = Observation("check:search_index:acl_coverage", True, "2 rows without labels")
    healthy = Observation("check:search_index:acl_coverage", False, "ok")
    alerts, state = transitions({}, [failing, Observation("job:ingest", False, "ok")])
    assert [(a.key, a.state) for a in alerts] == [("check:search_index:acl_coverage", "failing")]
    alerts, state = transitions(state, [failing])
    assert alerts == []  # still failing: not sent again
    alerts, state = transitions(state, [healthy])
    assert [(a.state, a.summary) for a in alerts] == [("recovered", "ok")]
    alerts, state = transitions(state, [healthy])
    assert alerts == [] and state == {"check:search_index:acl_coverage": False, "job:ingest": False}


def test_sender_logs_posts_and_mails_each_alert(webhook, smtp, caplog):
    config = AlertsConfig(webhook_url=webhook.url, ui_base_url="http://ui:3000",
                          smtp=SmtpConfig(host="127.0.0.1", port=smtp.port, sender="rag@example.org", recipients=("oncall@example.org",)))
    (alert,), _ = transitions({}, [Observation("job:ingest", True, "run abc failed: boom", {"run_id": "abc"})])
    webhook.fail_next = 1  # a 500 is retried
    with caplog.at_level(logging.INFO, logger="rag_pipeline.lifecycle.alerts"):
        outcome = AlertSender(config).send(alert)
    assert outcome == {"log": "sent", "webhook": "sent", "smtp": "sent"}
    (posted,) = webhook.received
    assert posted["key"] == "job:ingest" and posted["state"] == "failing" and posted["url"] == "http://ui:3000/runs/abc"
    # The human line chat webhooks (Slack, Teams, Mattermost) require, beside the structured fields.
    assert posted["text"] == "[rag_pipeline] FAILING: job:ingest: run abc failed: boom (http://ui:3000/runs/abc)"
    (line,) = [json.loads(r.message) for r in caplog.records if "rag_pipeline.alert" in r.message]
    assert line["event"] == "rag_pipeline.alert" and line["summary"] == "run abc failed: boom"
    ((recipients, mail),) = smtp.messages
    assert recipients == ["oncall@example.org"] and mail["Subject"] == "[rag_pipeline] FAILING: job:ingest"
    assert "run abc failed: boom" in mail.get_payload()

    # A receiver that refuses the payload (4xx) is not retried, and the other sinks still get the alert.
    webhook.fail_next, webhook.status_for_failures = 5, 400
    outcome = AlertSender(config).send(alert)
    assert outcome["webhook"].startswith("failed: webhook http://127.0.0.1:") and "answered 400" in outcome["webhook"]
    assert webhook.fail_next == 4 and outcome["smtp"] == "sent" and len(smtp.messages) == 2


def test_a_busy_webhook_is_tried_again_after_the_wait_it_asks_for(webhook):
    (alert,), _ = transitions({}, [Observation("job:ingest", True, "run abc failed: boom")])
    webhook.fail_next, webhook.status_for_failures, webhook.failure_headers = 1, 429, {"Retry-After": "2"}
    started = time.monotonic()
    outcome = AlertSender(AlertsConfig(webhook_url=webhook.url, max_attempts=2)).send(alert)
    assert outcome["webhook"] == "sent" and webhook.received_at[0] - started >= 2.0  # not the 0.5 s backoff
    webhook.fail_next, webhook.status_for_failures = 1, 503  # 5xx: retried too
    assert AlertSender(AlertsConfig(webhook_url=webhook.url, max_attempts=2)).send(alert)["webhook"] == "sent"


def test_alert_configuration_is_validated(tmp_path, make_settings):
    settings = make_settings(alerts={"webhook_url": "http://x", "smtp": {"host": "mail", "recipients": ["a@x", "b@x"]}})
    assert settings.alerts.smtp.recipients == ("a@x", "b@x") and settings.alerts.smtp.port == 25
    with pytest.raises(ConfigError, match=r"alerts\.smtp\.recipients: expected a list"):
        make_settings(alerts={"smtp": {"host": "mail", "recipients": "a@x, b@x"}})
    with pytest.raises(ConfigError, match=r"alerts\.smtp\.pasword: unknown key; did you mean password_env\?"):
        make_settings(alerts={"smtp": {"host": "mail", "recipients": ["a@x"], "pasword": "x"}})
    with pytest.raises(ConfigError, match=r"alerts\.smtp\.recipients: Field required"):
        make_settings(alerts={"smtp": {"host": "mail"}})
    with pytest.raises(ConfigError, match=r"alerts\.smtp\.recipients: Tuple should have at least 1 item"):
        make_settings(alerts={"smtp": {"host": "mail", "recipients": []}})
    with pytest.raises(ConfigError, match="golden_labels"):
        make_settings(checks={"golden_set": "golden.jsonl"})


# --- the alert sensor over a real Dagster instance -------------------------------------------------------


def _tick(sensor: dg.SensorDefinition, instance, settings, cursor):
    context = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"rag": RagResource(settings)}
    )
    return sensor.evaluate_tick(context)


def test_alert_sensor_sends_failed_checks_and_runs_once_until_they_recover(clone, webhook, smtp, tmp_path):
    conn, base = clone
    import yaml

    raw = yaml.safe_load(base.config_file.read_text())
    raw["alerts"] = _alerts_config(webhook, smtp)
    base.config_file.write_text(yaml.safe_dump(raw))
    from rag_pipeline.config import load_settings

    settings = load_settings(base.config_file)
    defs = build_definitions(settings)
    sensor = defs.resolve_sensor_def("index_alerts")
    health_job = defs.resolve_job_def("index_health")
    table = sql.Identifier(store.versions.active_version(conn).table_name)

    with dg.DagsterInstance.ephemeral() as instance:
        assert health_job.execute_in_process(instance=instance).success
        tick = _tick(sensor, instance, settings, None)
        assert webhook.received == [] and smtp.messages == []  # healthy from the start: nothing to say

        conn.execute(sql.SQL("UPDATE {} SET acl_labels = '{{public}}' WHERE ordinal = 0").format(table))
        health_job.execute_in_process(instance=instance, raise_on_error=False)
        tick = _tick(sensor, instance, settings, tick.cursor)
        (alert,) = webhook.received
        assert alert["key"] == "check:search_index:acl_coverage" and alert["state"] == "failing"
        assert "labels differ" in alert["summary"] and alert["details"]["severity"] == "ERROR"
        assert smtp.messages[0][1]["Subject"] == "[rag_pipeline] FAILING: check:search_index:acl_coverage"

        # Failing again, and the sensor restarted from its stored cursor: nothing is re-sent.
        health_job.execute_in_process(instance=instance, raise_on_error=False)
        tick = _tick(sensor, instance, settings, tick.cursor)
        tick = _tick(sensor, instance, settings, tick.cursor)
        assert len(webhook.received) == 1 and len(smtp.messages) == 1
        assert "failing now: check:search_index:acl_coverage" in tick.skip_message

        conn.execute(sql.SQL("UPDATE {} t SET acl_labels = d.acl_labels FROM documents d WHERE d.doc_id = t.doc_id")
                     .format(table))
        health_job.execute_in_process(instance=instance)
        tick = _tick(sensor, instance, settings, tick.cursor)
        assert [(a["key"], a["state"]) for a in webhook.received[1:]] == [
            ("check:search_index:acl_coverage", "recovered")]

        # A failed run alerts too, with the step's error and a link to the run.
        promote = defs.resolve_job_def("promote_index_version")
        failed = promote.execute_in_process(
            instance=instance, raise_on_error=False,
            run_config={"ops": {"promote_version": {"config": {"version_id": 99}}}},
        )
        assert not failed.success
        tick = _tick(sensor, instance, settings, tick.cursor)
        alert = webhook.received[-1]
        assert alert["key"] == "job:promote_index_version" and alert["state"] == "failing"
        assert "v99 is not a building or ready version" in alert["summary"]
        assert alert["url"] == f"http://127.0.0.1:3000/runs/{failed.run_id}"
        assert len(smtp.messages) == 3


# --- the source sensor and the schedules -----------------------------------------------------------------


def test_source_sensor_launches_once_per_change_and_keeps_its_cursor(make_settings, corpus):
    settings = make_settings([{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}])
    sensor = build_definitions(settings).resolve_sensor_def("source_changes")
    assert sensor.job_name == "ingest" and sensor.default_status == dg.DefaultSensorStatus.STOPPED

    with dg.DagsterInstance.ephemeral() as instance:
        first = _tick(sensor, instance, settings, None)
        (request,) = first.run_requests
        assert request.tags["rag_pipeline/changed_sources"] == "sample"
        # Nothing changed; and a restarted daemon resumes from the stored cursor: no second launch.
        again = _tick(sensor, instance, settings, first.cursor)
        assert again.run_requests == [] and "no change" in again.skip_message

        (corpus / "handbook" / "new-policy.md").write_text("# New policy\n\nBadges are worn at all times.\n")
        changed = _tick(sensor, instance, settings, first.cursor)
        (second,) = changed.run_requests
        assert second.run_key != request.run_key
        # The same tick evaluated again (its cursor was not stored) asks for the same run: launched once.
        assert _tick(sensor, instance, settings, first.cursor).run_requests[0].run_key == second.run_key
        # Back to an earlier state is a new change (the index holds the later one): a new key.
        (corpus / "handbook" / "new-policy.md").unlink()
        back = _tick(sensor, instance, settings, changed.cursor)
        assert back.run_requests[0].run_key not in (request.run_key, second.run_key)
        # A sidecar edit (labels) is a change too.
        (corpus / "handbook" / "travel-policy.md.meta.json").write_text(json.dumps({"acl_labels": ["hr"]}))
        relabelled = _tick(sensor, instance, settings, back.cursor)
        assert relabelled.run_requests and relabelled.run_requests[0].run_key != back.run_requests[0].run_key


def test_schedules_and_swap_jobs_are_defined(make_settings):
    settings = make_settings(refresh_cron="*/30 * * * *", checks={"health_cron": "*/5 * * * *"})
    defs = build_definitions(settings)
    refresh = defs.resolve_schedule_def("incremental_refresh")
    assert refresh.cron_schedule == "*/30 * * * *" and refresh.job_name == "ingest"
    health = defs.resolve_schedule_def("index_health_checks")
    assert health.cron_schedule == "*/5 * * * *" and health.job_name == "index_health"
    for name in ("start_index_build", "build_index_version", "promote_index_version"):
        assert defs.resolve_job_def(name) is not None
    # Every job and asset job whose steps write the index holds the one-writer pool ("Materialize all" too).
    pooled = {job.name for job in defs.resolve_all_job_defs()
              if any(op.pool == "rag_pipeline_index_writer" for op in job.graph.iterate_op_defs())}
    assert {"ingest", "__ASSET_JOB", "housekeeping_job", "promote_index_version"} <= pooled, pooled


def test_the_run_queue_admits_one_index_writer_at_a_time_and_monitors_runs(make_settings, tmp_path, monkeypatch,
                                                                          db_url):
    from rag_pipeline.defs.run_monitoring import LocalRunLauncher

    settings = make_settings()
    monkeypatch.setenv("DAGSTER_HOME", str(settings.data_dir / "dagster_home"))  # the project's own home
    home = prepare_dagster_home(settings, db_url)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        pools = instance.get_concurrency_config().pool_config
        assert pools.default_pool_limit == 1 and pools.pool_granularity.value == "run"
        assert instance.run_monitoring_enabled and isinstance(instance.run_launcher, LocalRunLauncher)
        assert not instance.nux_enabled and not instance.telemetry_enabled  # no pop-up, nothing sent
        assert instance.run_coordinator.dequeue_interval_seconds == 1  # a UI launch waits a second, not five


def test_an_operators_dagster_yaml_is_never_written_and_no_password_is_written_in_clear(
    make_settings, tmp_path, monkeypatch, pg_admin_url
):
    from rag_pipeline.defs.runs import DAGSTER_URL_VARIABLE, GENERATED_MARK

    # An operator's instance: its dagster.yaml (a run launcher, compute logs elsewhere) is used as it is.
    operator_home = tmp_path / "operator_home"
    operator_home.mkdir()
    theirs = "run_launcher:\n  module: dagster._core.launcher.sync_in_memory_run_launcher\n  class: SyncInMemoryRunLauncher\n"
    (operator_home / "dagster.yaml").write_text(theirs)
    settings = make_settings()
    monkeypatch.setenv("DAGSTER_HOME", str(operator_home))
    assert prepare_dagster_home(settings, pg_admin_url) == operator_home
    assert (operator_home / "dagster.yaml").read_text() == theirs
    empty_home = tmp_path / "empty_home"  # an operator's home without a file: still theirs, nothing written
    empty_home.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(empty_home))
    prepare_dagster_home(settings, pg_admin_url)
    assert list(empty_home.iterdir()) == []

    # The project's own home gets a generated file; a URL's password is read from the environment, never written.
    own_home = settings.data_dir / "dagster_home"
    monkeypatch.setenv("DAGSTER_HOME", str(own_home))
    monkeypatch.delenv(DAGSTER_URL_VARIABLE, raising=False)
    role = f"dagster_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 's3cr3t-pw'").format(sql.Identifier(role)))
        admin.execute(sql.SQL("CREATE DATABASE {0} OWNER {0}").format(sql.Identifier(role)))
    try:
        with_password = psycopg.conninfo.make_conninfo(pg_admin_url, dbname=role, user=role, password="s3cr3t-pw")
        # A file an earlier release generated there (unmarked, the password in clear) is recognised and replaced.
        own_home.mkdir(parents=True, exist_ok=True)
        (own_home / "dagster.yaml").write_text(yaml.safe_dump({
            "storage": {"postgres": {"postgres_url": "postgresql://u:s3cr3t-pw@h/d"}}, "telemetry": {"enabled": False},
            "run_queue": {"max_concurrent_runs": 4}}))
        prepare_dagster_home(settings, with_password)
        written = (own_home / "dagster.yaml").read_text()
        assert written.startswith(GENERATED_MARK) and "s3cr3t-pw" not in written
        assert f"env: {DAGSTER_URL_VARIABLE}" in written and "s3cr3t-pw" in os.environ[DAGSTER_URL_VARIABLE]
        with dg.DagsterInstance.from_config(str(own_home)) as instance:
            assert instance.get_runs(limit=1) == []  # the instance reads the URL from the environment
    finally:
        with psycopg.connect(pg_admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


# --- the index write lock ---------------------------------------------------------------------------------


def test_a_refresh_waits_for_the_one_writing_and_gives_up_clearly(make_settings, corpus, db_url):
    settings = make_settings([{"name": "sample", "root": str(corpus), "acl_labels": ["staff"]}], lock_timeout="1s")
    with index_write_lock(db_url, "refresh A"):
        started = time.monotonic()
        with pytest.raises(IndexLockTimeout, match=r"held by refresh A \(pid \d+"):
            process_pending(db_url, settings, parse=False, chunk=False)
        assert time.monotonic() - started >= 0.9
        # Backfill shards share the lock with each other, never with a refresh.
        with pytest.raises(IndexLockTimeout):
            with index_write_lock(db_url, "backfill", shared=True, timeout_seconds=0.5):
                pass
    with index_write_lock(db_url, "shard 0", shared=True), index_write_lock(db_url, "shard 1", shared=True,
                                                                            timeout_seconds=0.5):
        pass

    # A refresh that finds another one writing waits for it, then does its work.
    released: list[float] = []

    def other_refresh() -> None:
        with index_write_lock(db_url, "other refresh"):
            time.sleep(1.0)
            released.append(time.monotonic())

    holder = threading.Thread(target=other_refresh)
    holder.start()
    time.sleep(0.3)
    stats = discover(db_url, settings.sources, lock_timeout_seconds=30)
    finished = time.monotonic()
    holder.join()
    assert stats.documents_seen == 7 and finished >= released[0]


# --- secrets stay secret ---------------------------------------------------------------------------------


def test_a_webhook_url_never_reaches_errors_or_logs(webhook, caplog):
    secret_url = webhook.url.replace("/hooks/rag", "/services/T0001/B0002/s3cr3tT0k3n")
    webhook.fail_next = 10  # the receiver answers 500 to every attempt
    sender = AlertSender(AlertsConfig(webhook_url=secret_url, max_attempts=2))
    with caplog.at_level("INFO"):
        outcome = sender.send(Alert("job:ingest", "failing", "boom", {}, "now"))
    assert outcome["webhook"].startswith("failed: ") and "500" in outcome["webhook"]
    assert "s3cr3tT0k3n" not in outcome["webhook"] and "s3cr3tT0k3n" not in caplog.text
    assert "http://127.0.0.1:" in outcome["webhook"]  # which host failed is still said


def test_redaction_of_urls():
    from rag_pipeline.endpoints.redaction import redact, redact_url

    assert redact_url("https://user:pw@llm.example.org:8443/v1?key=abc") == "https://llm.example.org:8443/…"
    assert redact_url("not a url") == "<url>"
    assert redact("POST https://hooks.slack.com/services/T/B/xyz failed", "https://hooks.slack.com/services/T/B/xyz") \
        == "POST https://hooks.slack.com/… failed"
    assert redact("dial http://bob:hunter2@10.0.0.5/x") == "dial http://10.0.0.5/x"
    secret = "https://hooks.slack.com/services/T/B/xyz"
    for spelled in ("https://Hooks.Slack.com/services/T/B/xyz", "https://hooks.slack.com:443/services/T/B/xyz",
                    "https://hooks.slack.com/services/T/B/%78yz?a=1"):  # as httpx may print it
        assert "xyz" not in redact(f"failed for url '{spelled}'", secret)


@pytest.fixture
def certificate(tmp_path):
    """A self-signed certificate for 127.0.0.1, made with openssl."""
    import subprocess

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out",
                    str(cert)], check=True, capture_output=True)
    return key, cert


def _tls_mail_server(key, cert, implicit: bool):
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    sink = MailSink()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        sink.port = probe.getsockname()[1]
    tls = {"ssl_context": context} if implicit else {"tls_context": context, "require_starttls": True}
    return sink, Controller(sink, hostname="127.0.0.1", port=sink.port, **tls)


@pytest.mark.parametrize("implicit", [False, True], ids=["starttls", "implicit-tls"])
def test_smtp_verifies_the_servers_certificate(certificate, implicit, monkeypatch):
    key, cert = certificate
    sink, controller = _tls_mail_server(key, cert, implicit)
    monkeypatch.setenv("RAG_SMTP_PASSWORD", "pw")
    base = {"host": "127.0.0.1", "port": sink.port, "recipients": ("oncall@example.org",),
            "starttls": not implicit, "implicit_tls": implicit}
    alert = Alert("job:ingest", "failing", "boom", {}, "now")
    controller.start()
    try:
        untrusted = AlertSender(AlertsConfig(smtp=SmtpConfig(**base), max_attempts=1)).send(alert)
        assert untrusted["smtp"].startswith("failed") and "CERTIFICATE_VERIFY_FAILED" in untrusted["smtp"]
        assert sink.messages == []
        trusted = AlertSender(AlertsConfig(smtp=SmtpConfig(**base, ca_file=str(cert)), max_attempts=1)).send(alert)
        assert trusted["smtp"] == "sent" and len(sink.messages) == 1
    finally:
        controller.stop()


def test_smtp_never_sends_a_password_in_clear_to_another_host():
    smtp = SmtpConfig(host="mail.example.org", port=25, recipients=("a@example.org",), username="rag",
                      password_env="RAG_SMTP_PASSWORD")
    outcome = AlertSender(AlertsConfig(smtp=smtp, max_attempts=1)).send(Alert("k", "failing", "s", {}, "now"))
    assert "refusing to send the SMTP password unencrypted" in outcome["smtp"]
