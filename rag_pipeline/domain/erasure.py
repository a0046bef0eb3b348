"""How erased documents are named: by an HMAC of their id under a key kept outside the database
(RAG_PIPELINE_ERASURE_KEY), never by a plain hash, which a guess of the path could confirm."""

from __future__ import annotations

import hashlib
import hmac
import os

ERASURE_KEY_ENV = "RAG_PIPELINE_ERASURE_KEY"
MIN_KEY_CHARS = 16


class ErasureError(RuntimeError):
    """Erasure cannot run (no key, nothing to erase); nothing was changed."""


def erasure_key() -> bytes:
    key = os.environ.get(ERASURE_KEY_ENV, "")
    if len(key) < MIN_KEY_CHARS:
        raise ErasureError(f"{ERASURE_KEY_ENV} must hold a secret of at least {MIN_KEY_CHARS} characters: erasure "
                           "records name documents by an HMAC under it, never by a guessable hash")
    return key.encode()


def subject(key: bytes, doc_id: str) -> str:
    """How the audit record names a document: HMAC-SHA256 of its id under the erasure key."""
    return hmac.new(key, doc_id.encode(), hashlib.sha256).hexdigest()
