"""Retrieved text is untrusted: it ends up in a language model's prompt. Chunks that look like they try to
steer that model (instructions to ignore the prompt, chat-template role tags, fake system messages) are
flagged at ingest, so the application can quote them as data, drop them, or show them with a warning.
Flagging never removes text: a document may legitimately discuss prompt injection.
"""

from __future__ import annotations

import re

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


def injection_flags(text: str) -> list[str]:
    """Names of the prompt-injection patterns the text matches, in a stable order."""
    return [name for name, pattern in INJECTION_PATTERNS.items() if pattern.search(text)]
