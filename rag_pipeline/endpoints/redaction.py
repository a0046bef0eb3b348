"""Keeping endpoint secrets out of logs, errors and Dagster metadata.

A webhook URL is a credential (Slack and Teams put the secret in its path); an endpoint URL may carry a user and
password or a key in its query. Whatever is shown says which host was involved, never the rest.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import urlsplit

# Bounded repetitions: text from errors and logs may hold long runs of anything, and an unbounded scheme or user
# part would be tried from every position of such a run (quadratic).
_URL_RE = re.compile(r"[a-z][a-z0-9+.-]{0,31}://[^\s'\"<>]+", re.IGNORECASE)
_CREDENTIALS_RE = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]{0,31}://)[^/\s@:]{1,256}(?::[^/\s@]{0,256})?@",
                             re.IGNORECASE)


def redact_url(url: str) -> str:
    """scheme://host[:port], with '/…' when a path or query was dropped; no user, password, path or query."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<url>"
    if not parts.scheme or not host:
        return "<url>"
    rest = "/…" if parts.path.strip("/") or parts.query else ""
    return f"{parts.scheme}://{host}{port}{rest}"


def redact(text: str, *urls: str | None) -> str:
    """`text` with every URL to the host of a given URL shown redacted, however it is spelled (httpx prints
    URLs normalised: another case, an explicit port, percent-encoding), and user:password@ removed from any
    other URL."""
    hosts = {_host(url) for url in urls if url} - {None}

    def replace(match: re.Match[str]) -> str:
        found = match.group()
        return redact_url(found) if _host(found) in hosts else _CREDENTIALS_RE.sub(r"\g<scheme>", found)

    return _URL_RE.sub(replace, text)


def _host(url: str) -> str | None:
    try:
        host = urlsplit(url.strip()).hostname
    except ValueError:
        return None
    return host.lower() if host else None


class _RedactingFilter(logging.Filter):
    """Rewrites records that name a secret URL (httpx logs every request's full URL at INFO)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.urls:
            message = record.getMessage()
            redacted = redact(message, *self.urls)
            if redacted != message:
                record.msg, record.args = redacted, ()
        return True


_filter = _RedactingFilter()


def keep_out_of_logs(url: str | None, logger_name: str = "httpx") -> None:
    """From now on, records of `logger_name` show `url` redacted."""
    if not url:
        return
    _filter.urls.add(url)
    target = logging.getLogger(logger_name)
    if _filter not in target.filters:
        target.addFilter(_filter)
