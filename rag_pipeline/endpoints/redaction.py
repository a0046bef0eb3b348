"""Keeping secrets out of logs, errors and Dagster metadata: the one place that knows what a credential in text
looks like.

A webhook URL is a credential (Slack and Teams put the secret in its path); any URL may carry a user and password
(an object store's `endpoint_url`, a database URL) or a key in its query (`?sig=`, `X-Amz-Signature=`, `token=`);
a libpq connection string may say `password=...`. `redact_credentials` removes all of these from any text;
`redact` also shows given URLs as their host only. `install_log_redaction` applies them to every log record this
process makes, whichever handler (a terminal, Dagster's event log, a compute log) it goes to.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

# Bounded repetitions: text from errors and logs may hold long runs of anything, and an unbounded scheme or user
# part would be tried from every position of such a run (quadratic).
_URL_RE = re.compile(r"[a-z][a-z0-9+.-]{0,31}://[^\s'\"<>]+", re.IGNORECASE)


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
    if not hosts:
        return redact_credentials(text)

    def replace(match: re.Match[str]) -> str:
        found = match.group()
        return redact_url(found) if _host(found) in hosts else _without_credentials(found)

    return redact_credentials(_URL_RE.sub(replace, text))


REDACTED = "***"
# Names whose value is a credential: a query parameter, a key=value pair or a quoted key whose name is one of these
# words, or ends in one after a separator (X-Amz-Signature, access_token, client_secret, sslpassword).
_SECRET_WORDS = frozenset({"password", "passwd", "pwd", "sslpassword", "secret", "token", "signature", "apikey"})
# A key named by what it opens (api_key, secret_access_key, account_key); a bare `key=` outside a URL is more often
# an object's key than a credential.
_KEY_KINDS = frozenset({"api", "access", "secret", "private", "account", "master", "signing", "subscription"})
# In a URL's query these name credentials too (`?key=` of an API, `?sig=` of a SAS, `?auth=`).
_QUERY_WORDS = _SECRET_WORDS | {"key", "sig", "auth", "credential", "pass", "awsaccesskeyid"}
_NAME_PARTS_RE = re.compile(r"[-_.]")
_QUERY_SEPARATOR_RE = re.compile(r"([&;])")
# key=value (libpq's conninfo, a repr, an environment line) and 'key': 'value' (a dict's repr, JSON). Bounded runs:
# the text may be anything (see _URL_RE).
_ASSIGNMENT_RE = re.compile(
    r"(?<![\w.-])(?P<name>[a-z_][\w.-]{0,63})(?P<sep>[ \t]{0,8}=[ \t]{0,8})"
    r"(?P<value>'(?:[^'\\\n]|\\.){0,4096}'|\"(?:[^\"\\\n]|\\.){0,4096}\"|[^\s'\"]{1,4096})", re.IGNORECASE)
_QUOTED_KEY_RE = re.compile(
    r"(?P<q>[\"'])(?P<name>[a-z_][\w.-]{0,63})(?P=q)(?P<sep>[ \t]{0,8}:[ \t]{0,8})"
    r"(?P<value>'(?:[^'\\\n]|\\.){0,4096}'|\"(?:[^\"\\\n]|\\.){0,4096}\")", re.IGNORECASE)
_AUTHORIZATION_RE = re.compile(r"(?P<name>(?:proxy-)?authorization)(?P<sep>[\"']?[ \t]{0,8}[:=][ \t]{0,8}[\"']?)"
                               r"(?:(?:basic|bearer|digest|token)[ \t]{1,8})?[^\s\"',]{1,4096}", re.IGNORECASE)


def secret_name(name: str, *, in_query: bool = False) -> bool:
    """Whether a value under `name` is a credential (case and separators as written anywhere)."""
    parts = _NAME_PARTS_RE.split(name.lower())
    words = _QUERY_WORDS if in_query else _SECRET_WORDS
    return (name.lower() in words or parts[-1] in words
            or (parts[-1] == "key" and len(parts) > 1 and parts[-2] in _KEY_KINDS))


def redact_credentials(text: str) -> str:
    """`text` with every credential it may carry replaced: the user and password of any URL removed
    (`postgresql://rag:pw@db/rag` -> `postgresql://db/rag`), a secret query parameter's value (`?sig=***`,
    `X-Amz-Signature=***`, `token=***`, `key=***`), `password=***` of a libpq connection string and
    `password='***'` of a repr, an Authorization header's value, and every secret this process was told about
    (`keep_secret`). Everything else (hosts, paths, what failed) stays: an operator must still see what went wrong."""
    if not text:
        return text
    # Every log record passes here: a pattern runs only where its anchor is (a long record with no URL must not
    # pay for the URL pattern's attempt at every position).
    if "://" in text:
        text = _URL_RE.sub(lambda match: _without_credentials(match.group()), text)
    if "=" in text:
        text = _ASSIGNMENT_RE.sub(_masked, text)
    if ":" in text:
        text = _QUOTED_KEY_RE.sub(_masked, text)
    if "authorization" in text.lower():
        text = _AUTHORIZATION_RE.sub(lambda match: f"{match['name']}{match['sep']}{REDACTED}", text)
    for secret in _known_secrets():
        text = text.replace(secret, REDACTED)
    return text


def _masked(match: re.Match[str]) -> str:
    value = match["value"]
    if not secret_name(match["name"]) or value.strip("'\"").startswith(REDACTED):  # masked in a URL already
        return match.group()
    quote = value[0] if value[0] in "'\"" and len(value) > 1 and value[-1] == value[0] else ""
    return f"{match.group()[:match.start('value') - match.start()]}{quote}{REDACTED}{quote}"


def _without_credentials(url: str) -> str:
    """One URL without its user and password, and with the values of its secret query parameters masked. Plain
    string work, no parsing that could refuse it: a URL in an error message may be cut off or odd."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = len(rest)
    for delimiter in "/?#":
        found = rest.find(delimiter)
        if found != -1:
            end = min(end, found)
    authority, tail = rest[:end], rest[end:]
    at = authority.rfind("@")
    if at != -1:
        authority = authority[at + 1:]
    query_at = tail.find("?")
    if query_at != -1:
        fragment_at = tail.find("#", query_at)
        query_end = len(tail) if fragment_at == -1 else fragment_at
        tail = tail[:query_at + 1] + _masked_query(tail[query_at + 1:query_end]) + tail[query_end:]
    return f"{scheme}://{authority}{tail}"


def _masked_query(query: str) -> str:
    parts = []
    for part in _QUERY_SEPARATOR_RE.split(query):
        name, sep, _ = part.partition("=")
        parts.append(f"{name}={REDACTED}" if sep and secret_name(unquote(name), in_query=True) else part)
    return "".join(parts)


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


def redact_value(value: Any) -> Any:
    """A JSON-like value (settings as dumped, metadata) with every string in it redacted (redact_credentials), and
    the value under a key that names a credential masked."""
    if isinstance(value, str):
        return redact_credentials(value)
    if isinstance(value, Mapping):
        return {key: REDACTED if isinstance(key, str) and secret_name(key) and isinstance(item, str) and item
                else redact_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(item) for item in value] if isinstance(value, list) else \
            tuple(redact_value(item) for item in value)
    return value


# Secrets this process holds (passwords of configured URLs, values of the variables the configuration names):
# masked wherever they appear, however a library spells the text around them. Shorter ones would mask common words.
MIN_SECRET_CHARS = 4
_secrets: tuple[str, ...] = ()
_lock = threading.Lock()


def keep_secret(value: str | None) -> None:
    """From now on `value` (as written and percent-decoded) is masked in all text this process redacts."""
    global _secrets
    found = {v for v in (value, unquote(value)) if len(v) >= MIN_SECRET_CHARS} if value else set()
    with _lock:
        # Longest first: a secret that holds another is masked whole.
        _secrets = tuple(sorted(set(_secrets) | found, key=len, reverse=True))


def _known_secrets() -> tuple[str, ...]:
    return _secrets


def keep_secrets_of(settings: Mapping[str, Any]) -> None:
    """Every secret a loaded configuration (`Settings.model_dump()`) leads to: the password of each URL or
    connection string in it, and the value of each environment variable it names for a credential (`*_env`,
    `credentials_env`)."""
    for key, value in _walk(settings):
        if isinstance(value, str) and key.endswith("_env"):
            keep_secret(os.environ.get(value))
        elif isinstance(value, str):
            for password in _passwords_in(value):
                keep_secret(password)


def _walk(value: Any, key: str = "") -> Iterable[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for name, item in value.items():
            # credentials_env: {access_key_id: VARIABLE, ...}: every value names a variable.
            yield from _walk(item, f"{name}_env" if key.endswith("_env") else str(name))
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _walk(item, key)
    else:
        yield key, value


def _passwords_in(text: str) -> list[str]:
    found = []
    for match in _URL_RE.finditer(text):
        try:
            password = urlsplit(match.group()).password
        except ValueError:
            continue
        if password:
            found.append(password)
    found += [m["value"].strip("'\"") for m in _ASSIGNMENT_RE.finditer(text) if secret_name(m["name"])]
    return found


def _redact_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # noqa: BLE001 - a bad format string: logging reports it when the record is emitted
        return
    redacted = redact(message, *_filter.urls)
    if redacted != message:
        record.msg, record.args = redacted, ()
    if record.exc_info and not record.exc_text:
        # Formatters reuse exc_text: the traceback's messages (an error naming a URL) are redacted once, here.
        record.exc_text = redact(logging.Formatter().formatException(record.exc_info), *_filter.urls)


class RedactingFilter(logging.Filter):
    """A handler filter that redacts each record it passes (for handlers of records made before
    install_log_redaction, or by a record factory that replaced it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        _redact_record(record)
        return True


_installed = False


def install_log_redaction() -> None:
    """Redact every log record this process makes from now on, as it is made: its message and its traceback, for
    every handler it reaches (a terminal, Dagster's event log and console, the compute log a step's output goes
    to), including handlers Dagster adds to a run after this. A filter on handlers alone would miss those; it is
    put on the handlers there are now all the same. Idempotent."""
    global _installed
    with _lock:
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def make_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            _redact_record(record)
            return record

        logging.setLogRecordFactory(make_record)
        handlers = [*logging.getLogger().handlers, logging.lastResort]
        for handler in handlers:
            if handler is not None and not any(isinstance(f, RedactingFilter) for f in handler.filters):
                handler.addFilter(RedactingFilter())
        _installed = True
