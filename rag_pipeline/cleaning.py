"""Text normalisation applied to every page before hashing and chunking.

Kept deliberately conservative: it must never change meaning, only representation, because
`content_hash` is computed on its output and decides whether a document is re-chunked and re-embedded.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable

_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SPACES_RE = re.compile(r"[ \t\u00a0\u2000-\u200b\u202f\u205f\u3000]+")
_BLANK_LINES_RE = re.compile(r"\n{3,}")
PAGE_SEPARATOR = "\n\f\n"


def clean_text(text: str) -> str:
    """Unicode NFKC, no control characters, single spaces, no trailing blanks, at most one empty line."""
    text = unicodedata.normalize("NFKC", text.replace("\r\n", "\n").replace("\r", "\n"))
    text = _CONTROL_RE.sub("", text)
    lines = [_SPACES_RE.sub(" ", line).strip() for line in text.split("\n")]
    return _BLANK_LINES_RE.sub("\n\n", "\n".join(lines)).strip()


def content_hash(pages: Iterable[str]) -> str:
    """sha256 of the cleaned text of all pages, in order: equal text means equal hash, whatever the bytes."""
    digest = hashlib.sha256()
    for index, page in enumerate(pages):
        if index:
            digest.update(PAGE_SEPARATOR.encode())
        digest.update(page.encode("utf-8"))
    return digest.hexdigest()
