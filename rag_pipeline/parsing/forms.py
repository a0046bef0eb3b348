"""What a PDF holds outside its page content: filled AcroForm fields and the notes readers attached.

A filled form keeps its values in field widgets (drawn from appearance streams, not from the page's text), so
text extraction never sees 'Alice' typed into "first_name". Each filled field becomes a line
`Form field <name>: <value>`, and each free-text or sticky note `Annotation: <text>`, top to bottom. Names are
fully qualified through the field's parents. Everything here comes from the file: counts, depths and lengths
are bounded.
"""

from __future__ import annotations

from typing import Any

MAX_ANNOTATIONS = 2000
MAX_VALUE_CHARS = 2000
MAX_PARENT_DEPTH = 16
NOTE_SUBTYPES = {"FreeText", "Text"}


def _resolve(value: Any) -> Any:
    from pdfminer.pdftypes import resolve1

    return resolve1(value)


def _text(value: Any, depth: int = 0) -> str:
    """A PDF text string, name, number or (shallow) array as plain text; anything else says nothing."""
    from pdfminer.psparser import PSLiteral
    from pdfminer.utils import decode_text

    value = _resolve(value)
    if isinstance(value, bytes):
        text = decode_text(value)
    elif isinstance(value, str):
        text = value
    elif isinstance(value, PSLiteral):
        text = str(value.name)
    elif isinstance(value, bool):
        text = ""
    elif isinstance(value, int | float):
        text = str(value)
    elif isinstance(value, list) and depth < 2:
        text = ", ".join(t for t in (_text(v, depth + 1) for v in value[:100]) if t)
    else:
        return ""  # dictionaries and streams (a signature's /V) are not text
    return " ".join(text.split())[:MAX_VALUE_CHARS]


def _inherited(field: dict[str, Any], key: str) -> Any:
    """A field attribute, looked up through its parents (a widget inherits value and type)."""
    node: Any = field
    for _ in range(MAX_PARENT_DEPTH):
        if not isinstance(node, dict):
            return None
        if key in node:
            return node[key]
        node = _resolve(node.get("Parent"))
    return None


def _qualified_name(field: dict[str, Any]) -> str:
    parts: list[str] = []
    node: Any = field
    for _ in range(MAX_PARENT_DEPTH):
        if not isinstance(node, dict):
            break
        if "T" in node:
            parts.insert(0, _text(node["T"]))
        node = _resolve(node.get("Parent"))
    return ".".join(p for p in parts if p)


def page_annotations(page_obj: Any) -> list[dict[str, Any]]:
    """The page's annotation dictionaries, each resolved one level only. pdfplumber's `page.annots` resolves
    every reference recursively, which shared references make exponential and parent links make endless."""
    annots = _resolve(getattr(page_obj, "annots", None))
    if not isinstance(annots, list):
        return []
    resolved = (_resolve(a) for a in annots[:MAX_ANNOTATIONS])
    return [a for a in resolved if isinstance(a, dict)]


def _top(annot: dict[str, Any]) -> float:
    """How high on the page the annotation sits (larger is higher), for ordering only."""
    rect = _resolve(annot.get("Rect"))
    try:
        return -max(float(_resolve(rect[1])), float(_resolve(rect[3])))
    except (TypeError, ValueError, IndexError):
        return 0.0


def annotation_lines(annots: list[dict[str, Any]]) -> tuple[list[str], dict[str, int]]:
    """Lines for the filled fields and notes among one page's annotation dictionaries (`page_annotations`),
    top to bottom; a field named twice (the options of one radio group) is said once."""
    lines: list[tuple[float, str]] = []
    named: set[str] = set()
    fields = notes = 0
    for data in annots[:MAX_ANNOTATIONS]:
        if not isinstance(data, dict):
            continue
        subtype = _text(data.get("Subtype"))
        if subtype == "Widget":
            if _text(_inherited(data, "FT")) == "Sig":
                continue  # a signature's value is a signature, not text
            value = _text(_inherited(data, "V"))
            if not value or value == "Off":  # an empty field or an unchecked box says nothing
                continue
            name = _qualified_name(data) or "unnamed"
            if name in named:
                continue
            named.add(name)
            lines.append((_top(data), f"Form field {name}: {value}"))
            fields += 1
        elif subtype in NOTE_SUBTYPES:
            contents = _text(data.get("Contents"))
            if contents:
                lines.append((_top(data), f"Annotation: {contents}"))
                notes += 1
    return [text for _, text in sorted(lines, key=lambda item: item[0])], {"form_fields": fields, "annotations": notes}
