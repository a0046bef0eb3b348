"""Alerts for failed asset checks and failed runs: a structured log line always, optionally a JSON webhook
and e-mail over SMTP.

Alerting is edge-triggered: a key (a check, or a job) alerts when it starts failing and once more when it
recovers, never on every failed evaluation in between, so an hourly refresh that keeps failing sends one
message, not one an hour.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import smtplib
import ssl
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from email.message import EmailMessage
from typing import Any

from rag_pipeline.config import AlertsConfig, SmtpConfig
from rag_pipeline.endpoints.http_retry import retry_after_seconds
from rag_pipeline.endpoints.redaction import keep_out_of_logs, redact, redact_url

log = logging.getLogger("rag_pipeline.lifecycle.alerts")


@dataclass(frozen=True)
class Observation:
    """The latest known state of one thing that can fail."""

    key: str  # "check:search_index:acl_coverage" or "job:ingest"
    failing: bool
    summary: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Alert:
    key: str
    state: str  # "failing" | "recovered"; a notice: "warning" (something will happen) | "done" (it happened)
    summary: str
    details: dict[str, Any]
    at: str

    def payload(self) -> dict[str, Any]:
        """The structured fields, and `text`: the one human line Slack, Teams and Mattermost incoming webhooks
        require (they refuse a body without it)."""
        return {"text": f"{self.subject}: {self.summary}", "source": "rag_pipeline", **asdict(self)}

    @property
    def subject(self) -> str:
        return f"[rag_pipeline] {self.state.upper()}: {self.key}"


def transitions(previous: Mapping[str, bool], observations: Iterable[Observation]) -> tuple[list[Alert], dict[str, bool]]:
    """Alerts for the keys whose state changed since `previous` (key -> failing), and the new state.

    A key seen failing for the first time alerts; one seen healthy for the first time does not.
    """
    state = dict(previous)
    alerts: list[Alert] = []
    now = datetime.now(UTC).isoformat(timespec="seconds")
    for observation in observations:
        was_failing = state.get(observation.key, False)
        if observation.failing != was_failing:
            alerts.append(Alert(observation.key, "failing" if observation.failing else "recovered",
                                observation.summary, observation.details, now))
        state[observation.key] = observation.failing
    return alerts, state


class DeliveryError(RuntimeError):
    """A sink did not accept an alert after every attempt."""


class RetryLater(Exception):
    """The receiver is busy (429) or failing (5xx): try again, after `after` seconds if it said so."""

    def __init__(self, message: str, after: float = 0.0):
        super().__init__(message)
        self.after = after


MAX_RETRY_AFTER = 60.0  # a sensor tick must end: a receiver asking for longer is tried again at the next alert


def _with_retries(attempts: int, send: Any, secret_url: str | None = None) -> None:
    import httpx  # only where a sink is configured: every refresh loads this module

    for attempt in range(1, attempts + 1):
        try:
            send()
            return
        except DeliveryError:
            raise  # refused for good: retrying cannot help
        except (RetryLater, httpx.HTTPError, OSError, smtplib.SMTPException) as exc:
            if attempt == attempts:
                # httpx names the URL it failed on; a webhook URL is a credential.
                raise DeliveryError(redact(f"{type(exc).__name__}: {exc}", secret_url)) from None
            asked = exc.after if isinstance(exc, RetryLater) else 0.0
            time.sleep(min(MAX_RETRY_AFTER, max(asked, 0.5 * 2 ** (attempt - 1))))


class AlertSender:
    """Delivers alerts to every configured sink; a sink that fails is reported, the others still get it."""

    def __init__(self, config: AlertsConfig, logger: logging.Logger = log) -> None:
        self.config = config
        self.logger = logger
        keep_out_of_logs(config.webhook_url)  # a webhook URL is a credential

    def send(self, alert: Alert) -> dict[str, str]:
        """Deliver one alert; returns sink -> "sent" | "off" | "failed: why"."""
        payload = alert.payload()
        if self.config.ui_base_url and alert.details.get("run_id"):
            payload["url"] = f"{self.config.ui_base_url.rstrip('/')}/runs/{alert.details['run_id']}"
            payload["text"] += f" ({payload['url']})"
        level = {"failing": logging.ERROR, "warning": logging.WARNING}.get(alert.state, logging.INFO)
        self.logger.log(level, json.dumps({"event": "rag_pipeline.alert", **payload}, default=str, sort_keys=True))
        outcome = {"log": "sent", "webhook": "off", "smtp": "off"}
        for sink, configured, deliver in (
            ("webhook", self.config.webhook_url, self._post),
            ("smtp", self.config.smtp, self._mail),
        ):
            if not configured:
                continue
            try:
                _with_retries(self.config.max_attempts, lambda deliver=deliver: deliver(payload, alert),
                              self.config.webhook_url)
                outcome[sink] = "sent"
            except DeliveryError as exc:
                outcome[sink] = f"failed: {exc}"
                self.logger.error(json.dumps({"event": "rag_pipeline.alert_delivery_failed", "sink": sink,
                                              "key": alert.key, "error": str(exc)}))
        return outcome

    def _post(self, payload: dict[str, Any], alert: Alert) -> None:
        import httpx

        assert self.config.webhook_url
        response = httpx.post(self.config.webhook_url, json=payload, timeout=self.config.webhook_timeout_seconds)
        answer = (f"webhook {redact_url(self.config.webhook_url)} answered {response.status_code}: "
                  f"{redact(response.text[:200], self.config.webhook_url)}")
        if response.status_code == 429 or response.status_code >= 500:
            raise RetryLater(answer, retry_after_seconds(response.headers.get("Retry-After")))
        if response.status_code >= 400:
            raise DeliveryError(answer)  # the receiver refuses this payload: sending it again will not help

    def _mail(self, payload: dict[str, Any], alert: Alert) -> None:
        smtp: SmtpConfig = self.config.smtp  # type: ignore[assignment]
        message = EmailMessage()
        message["Subject"] = alert.subject
        message["From"] = smtp.sender
        message["To"] = ", ".join(smtp.recipients)
        message.set_content(f"{alert.summary}\n\n{json.dumps(payload, indent=2, default=str, sort_keys=True)}\n")
        # TLS verifies the server's certificate and name (the system's CAs, or alerts.smtp.ca_file); port 465
        # speaks TLS from the first byte (implicit TLS), other ports upgrade with STARTTLS when configured.
        implicit = smtp.implicit_tls if smtp.implicit_tls is not None else smtp.port == 465
        if smtp.username and not (implicit or smtp.starttls) and not _is_loopback(smtp.host):
            raise DeliveryError("refusing to send the SMTP password unencrypted: set alerts.smtp.starttls "
                                "or use port 465")
        context = ssl.create_default_context(cafile=smtp.ca_file)
        client = (smtplib.SMTP_SSL(smtp.host, smtp.port, timeout=smtp.timeout_seconds, context=context) if implicit
                  else smtplib.SMTP(smtp.host, smtp.port, timeout=smtp.timeout_seconds))
        with client:
            if smtp.starttls and not implicit:
                client.starttls(context=context)
            if smtp.username:
                password = os.environ.get(smtp.password_env or "", "")
                if not password:
                    raise DeliveryError(f"alerts.smtp.password_env {smtp.password_env!r} is not set")
                client.login(smtp.username, password)
            client.send_message(message)


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
