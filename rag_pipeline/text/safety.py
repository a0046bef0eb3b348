"""Retrieved text is untrusted: it ends up in a language model's prompt. Chunks that look like they try to
steer that model (instructions to ignore the prompt, chat-template role tags, fake system messages) are
flagged at ingest, so the application can quote them as data, drop them, or show them with a warning.
Flagging never removes text: a document may legitimately discuss prompt injection.

The patterns read the text as it was written, whatever the format: HTML entities and Markdown backslash escapes
(Docling's Markdown of an Office or HTML file writes `<|im_start|>` as `&lt;|im\\_start|&gt;`) are undone, then NFKC, then format
characters (zero-width spaces, joiners, bidi controls, soft hyphens) are removed and Cyrillic and Greek letters
that look Latin are folded to Latin, so `ign\u200bore` and a Cyrillic `о` in "ignore" still read "ignore".
"""

from __future__ import annotations

import html
import re
import unicodedata

INJECTION_PATTERNS: dict[str, re.Pattern[str]] = {
    "ignore_instructions": re.compile(
        r"\b(ignore|disregard|forget|override)\b[^.\n]{0,40}\b(previous|prior|above|earlier|all|any|system)\b"
        r"[^.\n]{0,20}\b(instructions?|prompts?|rules|directions|guidelines)\b",
        re.IGNORECASE,
    ),
    "role_tag": re.compile(
        r"<\|?\s*(im_start|im_end|system|assistant|user|endoftext)\s*\|?>|\[/?INST\]|<</?SYS>>",
        re.IGNORECASE,
    ),
    "fake_role_turn": re.compile(r"^\s*(#{1,3}\s*)?(system|assistant)\s*(prompt)?\s*:", re.IGNORECASE | re.MULTILINE),
    "persona_override": re.compile(
        r"\byou are (now|no longer)\b|\bact as (an?|the) (unrestricted|unfiltered|jailbroken)\b|\bdeveloper mode\b",
        re.IGNORECASE,
    ),
    "exfiltration": re.compile(
        r"\b(reveal|print|show|repeat|leak)\b[^.\n]{0,30}\b(system prompt|hidden prompt|your instructions)\b",
        re.IGNORECASE,
    ),
}


# Letters of other scripts drawn like Latin ones (Unicode's confusables, the common lower and upper cases).
_CONFUSABLES = str.maketrans(
    "асеһіјӏоԛрѕуԝхкАВСЕНІЈКМОРЅТХУ"  # Cyrillic
    "αικνορυχΑΒΕΖΗΙΚΜΝΟΡΤΥΧ",  # Greek
    "acehijloqpsywxkABCEHIJKMOPSTXY"
    "aikvopuxABEZHIKMNOPTYX",
)
_MARKDOWN_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|<>~])")


def as_written(text: str) -> str:
    """The text the patterns read: format escaping undone, NFKC, format characters removed, confusables folded."""
    text = html.unescape(_MARKDOWN_ESCAPE.sub(r"\1", text))
    text = unicodedata.normalize("NFKC", text)
    text = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    return text.translate(_CONFUSABLES)


def injection_flags(text: str) -> list[str]:
    """Names of the prompt-injection patterns the text matches, in a stable order."""
    written = as_written(text)
    return [name for name, pattern in INJECTION_PATTERNS.items() if pattern.search(written)]
