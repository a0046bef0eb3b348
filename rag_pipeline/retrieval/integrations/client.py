"""The HTTP client the retrievers share: POST /search with the caller's API token, JSON errors raised as
SearchServiceError. The token decides the labels a search carries; a client cannot send labels."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

MODES = ("hybrid", "dense", "sparse")
BEARER_TOKEN = re.compile(r"[A-Za-z0-9\-._~+/]+=*")  # RFC 6750's b64token: nothing a header could be split on


class SearchServiceError(RuntimeError):
    """The search service refused or failed a request; `status` (0: no answer) and `code` say how."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"search service: {f'HTTP {status} ' if status else ''}{code}: {message}")
        self.status, self.code = status, code


class SearchClient:
    """`rag-pipeline serve` at `url`, searched with `token` (default: the RAG_SEARCH_TOKEN environment variable).

    `http_client` replaces the connection (e.g. one with your proxy or TLS settings, or a test client)."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0,
                 http_client: httpx.Client | None = None):
        token = token or os.environ.get("RAG_SEARCH_TOKEN")
        if not token:
            raise ValueError("a search needs an API token (token=... or RAG_SEARCH_TOKEN): it carries the caller's "
                             "labels, and there is no search without labels")
        if not BEARER_TOKEN.fullmatch(token):  # never quoted: an error message must not carry the secret
            raise ValueError("the API token holds characters a bearer token cannot (whitespace, a trailing newline "
                             "from a secret file, non-ASCII)")
        if http_client is None:
            _check_url(url)
            http_client = httpx.Client(base_url=url.rstrip("/"), timeout=timeout)
        self._client = http_client
        self._headers = {"Authorization": f"Bearer {token}"}

    def search(self, query: str, k: int | None = 10, mode: str = "hybrid") -> list[dict[str, Any]]:
        """The top `k` hits (None: the service's default) the token's labels may read."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        body: dict[str, Any] = {"query": query, "mode": mode} | ({} if k is None else {"k": k})
        try:
            response = self._client.post("/search", json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            raise SearchServiceError(0, "unreachable", f"{self._client.base_url}: {type(exc).__name__}: {exc}") from exc
        if response.is_redirect:  # not followed: the token goes to the URL named, nowhere else
            raise SearchServiceError(response.status_code, "redirect",
                                     f"redirected to {response.headers.get('location')!r}; not followed")
        if response.status_code != 200:
            try:
                error = response.json()["error"]
                code, message = str(error["code"]), str(error["message"])
            except (ValueError, KeyError, TypeError):
                code, message = "http_error", response.text[:200]
            raise SearchServiceError(response.status_code, code, message)
        try:
            results = response.json()["results"]
        except (ValueError, KeyError, TypeError):  # another server at that address, or a proxy's page
            raise SearchServiceError(response.status_code, "invalid_response",
                                     f"not a search response: {response.text[:200]!r}") from None
        if not isinstance(results, list):
            raise SearchServiceError(response.status_code, "invalid_response", "results is not a list")
        return results

    def close(self) -> None:
        self._client.close()


def _check_url(url: str) -> None:
    """An http(s) URL of a host, without credentials of its own (they would replace the token)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError as exc:
        raise ValueError(f"the service URL is malformed: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"the service URL must be http(s)://host[:port], got {parts.scheme or 'no'} scheme")
    if parts.username is not None or parts.password is not None:
        raise ValueError("the service URL must not carry a user or password: the API token is the credential")


# Arguments a caller might expect a search to take that the service decides: refused by name, never dropped.
DECIDED_BY_THE_SERVICE = {
    "labels": "a search's labels come from its API token (the service maps the token to labels)",
    "acl_labels": "a search's labels come from its API token (the service maps the token to labels)",
    "index_version": "the service searches its active index version",
    "version": "the service searches its active index version",
}


def refuse_arguments(arguments: Mapping[str, Any], where: str) -> None:
    """A TypeError naming each of `arguments` (what a retriever was given and would not use): a retriever must
    not seem to honour an argument it ignores, least of all one that narrows what a caller may read."""
    if not arguments:
        return
    reasons = "; ".join(f"{name!r}: {DECIDED_BY_THE_SERVICE.get(name, 'not an argument of this retriever')}"
                        for name in sorted(arguments))
    raise TypeError(f"{where} does not take {', '.join(repr(n) for n in sorted(arguments))} ({reasons})")


def metadata_of(result: dict[str, Any]) -> dict[str, Any]:
    """What a retrieved document carries beside its text: where it is, how it ranked, and its flags (a flagged
    text, e.g. one that looks like a prompt injection, is to be treated as data)."""
    return {key: result.get(key) for key in ("chunk_id", "doc_id", "source", "path", "page_start", "page_end",
                                             "section_path", "content_type", "score", "similarity", "flags",
                                             "occurrences", "rerank_score")}
