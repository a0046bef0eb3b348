"""Font diagnostics: fonts whose glyphs map to no Unicode text, and the scripts they were probably set in."""

from __future__ import annotations

from typing import Any

# CJK fonts and CMaps name their script: the OCR tier can then say whether its models read it.
SCRIPT_HINTS = (("Korean", ("KSC", "UniKS", "Batang", "Gulim", "Dotum", "Malgun", "HYGoThic", "HYSMyeongJo", "Nanum")),
                ("Japanese", ("UniJIS", "90ms", "Mincho", "MS-Gothic", "HeiseiMin", "HeiseiKaku", "KozMin", "Meiryo")),
                ("Chinese", ("GBK", "GB-EUC", "UniGB", "UniCNS", "B5pc", "SimSun", "SimHei", "MingLiU", "STSong")))


def fonts_without_unicode_map(page_obj: Any) -> set[str]:
    """Names of the page's composite fonts that address glyphs by id (Identity-H/V) and carry no /ToUnicode: the
    text read from them is a guess (pdfminer falls back on the embedded font's tables, which subsetting often
    scrambles into plausible but wrong characters), so it cannot be trusted whatever it looks like."""
    from pdfminer.pdftypes import resolve1

    try:
        fonts = resolve1(resolve1(page_obj.resources or {}).get("Font")) or {}
    except Exception:  # a malformed resource dictionary: no verdict
        return set()
    names = set()
    for ref in list(fonts.values())[:500] if isinstance(fonts, dict) else []:
        font = resolve1(ref)
        if not isinstance(font, dict) or font.get("ToUnicode") is not None:
            continue
        subtype, encoding = resolve1(font.get("Subtype")), resolve1(font.get("Encoding"))
        if getattr(subtype, "name", None) == "Type0" and getattr(encoding, "name", "") in ("Identity-H", "Identity-V"):
            base = resolve1(font.get("BaseFont"))
            names.add(str(getattr(base, "name", base)))
    return names


def unmapped_scripts(chars: list[dict[str, Any]]) -> list[str]:
    """Scripts named by the fonts of glyphs without a Unicode map ((cid:N) characters)."""
    fonts = {str(c.get("fontname", "")) for c in chars if str(c.get("text", "")).startswith("(cid:")}
    return [script for script, hints in SCRIPT_HINTS if any(h.lower() in f.lower() for f in fonts for h in hints)]


def unmapped_font_share(page: Any) -> float:
    unmapped = fonts_without_unicode_map(page.page_obj)
    if not unmapped or not page.chars:
        return 0.0
    return round(sum(1 for c in page.chars if c.get("fontname") in unmapped) / len(page.chars), 3)
