"""What a file may unpack to: a small file can expand without bound (a zip bomb, a page content stream of
gigabytes), so each limit is checked before the parser spends memory on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag_pipeline.parsing.pages import DeadLetter

MAX_ZIP_ENTRIES = 50_000


@dataclass(frozen=True)
class ParseLimits:
    """What a file may unpack to (parsing.max_pages, max_page_content_bytes, max_unpacked_bytes): a small file
    can expand without bound, so each is checked before the parser spends memory on it."""

    max_pages: int = 5000
    max_page_content_bytes: int = 64 * 1024 * 1024
    max_unpacked_bytes: int = 512 * 1024 * 1024


def check_unpacked_size(path: Path, limit: int) -> None:
    """An Office file is a zip: refuse one whose entries unpack to more than `limit` bytes (a zip bomb) or
    that holds more entries than any document needs. Declared sizes are checked, and Docling's unzipping
    stops at them."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise DeadLetter("corrupt", f"not a readable Office (zip) file: {exc}") from None
    if len(entries) > MAX_ZIP_ENTRIES:
        raise DeadLetter("too_large", f"{len(entries):,} zip entries (at most {MAX_ZIP_ENTRIES:,})")
    unpacked = sum(entry.file_size for entry in entries)
    if unpacked > limit:
        raise DeadLetter("too_large", f"unpacks to {unpacked:,} bytes; parsing.max_unpacked_bytes is {limit:,}")


def check_page_content_size(page_obj: Any, limit: int) -> None:
    """Decompress a page's Flate content streams with a cap before pdfminer decodes them whole: a stream bomb
    (kilobytes that inflate to gigabytes) is dead-lettered instead of exhausting memory. Streams with other
    filters are left to pdfminer."""
    import zlib

    from pdfminer.pdftypes import PDFStream, resolve1

    streams = resolve1(getattr(page_obj, "contents", None)) or []
    total = 0
    for stream in streams if isinstance(streams, list) else [streams]:
        stream = resolve1(stream)
        if not isinstance(stream, PDFStream) or stream.rawdata is None:
            continue
        if [str(getattr(name, "name", name)) for name, _ in stream.get_filters()] not in (["FlateDecode"], ["Fl"]):
            continue
        inflater = zlib.decompressobj()
        data = stream.rawdata
        try:
            while data and total <= limit:
                total += len(inflater.decompress(data, limit + 1 - total))
                data = inflater.unconsumed_tail
        except zlib.error:
            continue  # pdfminer has its own way with broken streams
        if total > limit:
            raise DeadLetter("too_large", f"a page's content streams unpack to more than {limit:,} bytes "
                                          "(parsing.max_page_content_bytes)")
