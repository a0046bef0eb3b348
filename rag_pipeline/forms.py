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


def _text(value: Any) -> str:
    """A PDF text string, name, number or array as plain text."""
    from pdfminer.psparser import PSLiteral
    from pdfminer.utils import decode_text

    value = _resolve(value)
    if value is None:
        return ""
    if isinstance(value, bytes):
        text = decode_text(value)
    elif isinstance(value, PSLiteral):
        text = str(value.name)
    elif isinstance(value, list):
        text = ", ".join(t for t in (_text(v) for v in value[:100]) if t)
    else:
        text = str(value)
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


def annotation_lines(annots: list[dict[str, Any]]) -> tuple[list[str], dict[str, int]]:
    """Lines for the filled fields and notes among one page's annotations (pdfplumber's `page.annots`)."""
    lines: list[tuple[float, str]] = []
    fields = notes = 0
    for annot in annots[:MAX_ANNOTATIONS]:
        data = _resolve(annot.get("data"))
        if not isinstance(data, dict):
            continue
        subtype = _text(data.get("Subtype"))
        top = float(annot.get("top") or 0.0)
        if subtype == "Widget":
            value = _text(_inherited(data, "V"))
            if not value or value == "Off":  # an empty field or an unchecked box says nothing
                continue
            name = _qualified_name(data) or "unnamed"
            lines.append((top, f"Form field {name}: {value}"))
            fields += 1
        elif subtype in NOTE_SUBTYPES:
            contents = _text(data.get("Contents"))
            if contents:
                lines.append((top, f"Annotation: {contents}"))
                notes += 1
    return [text for _, text in sorted(lines, key=lambda item: item[0])], {"form_fields": fields, "annotations": notes}
