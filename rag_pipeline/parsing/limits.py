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


# Content-Encoding values decoded (RFC 9110 section 8.4.1); `x-gzip` is gzip's old name, `identity` no coding.
DECODED_CODINGS = ("gzip", "x-gzip", "deflate")
_DECODE_READ_BYTES = 1 << 20


def decode_content_encoding(path: Path, encoding: str, limit: int) -> None:
    """Replace the file at `path`, stored with the HTTP `Content-Encoding` `encoding` (an object store serves it as
    stored), by its decoded bytes, so it is parsed as its own type and not as compressed bytes. The codings are
    undone in the reverse of the order listed. The decoded size is capped at `limit` (parsing.max_file_bytes) while
    decoding, so a gzip bomb is dead-lettered as too_large without being written out; a coding not decoded here is
    dead-lettered as unsupported, naming it; a body that is not what its coding says, as corrupt or truncated."""
    codings = [coding.strip().lower() for coding in encoding.split(",")]
    unknown = [coding for coding in codings if coding not in (*DECODED_CODINGS, "identity")]
    if unknown or not all(codings):
        raise DeadLetter("unsupported", f"Content-Encoding {encoding!r} is not decoded (only "
                         f"{', '.join(DECODED_CODINGS)} are)")
    for coding in reversed(codings):
        if coding != "identity" and path.stat().st_size:  # an empty body stays empty (dead-lettered as such)
            decoded = path.with_name(path.name + ".decoded")
            _inflate(path, decoded, coding, limit)
            decoded.replace(path)


def _inflate(source: Path, target: Path, coding: str, limit: int) -> None:
    import zlib

    gzip = coding != "deflate"
    with source.open("rb") as raw:
        head = raw.read(2)
        raw.seek(0)
        # HTTP's deflate is the zlib format; some servers send a bare deflate stream (no zlib header) instead.
        zlib_header = len(head) == 2 and head[0] & 0x0F == 8 and int.from_bytes(head, "big") % 31 == 0
        wbits = 16 + zlib.MAX_WBITS if gzip else zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
        inflater = zlib.decompressobj(wbits)
        written = 0
        try:
            with target.open("wb") as out:
                while block := raw.read(_DECODE_READ_BYTES):
                    while block:
                        chunk = inflater.decompress(block, limit + 1 - written)
                        written += len(chunk)
                        if written > limit:
                            raise DeadLetter("too_large", f"Content-Encoding {coding}: decodes to more than "
                                             f"{limit:,} bytes; parsing.max_file_bytes is {limit:,}")
                        out.write(chunk)
                        if inflater.eof and inflater.unused_data and gzip:
                            block = inflater.unused_data  # the next member of a multi-member gzip file
                            inflater = zlib.decompressobj(wbits)
                        elif inflater.eof and inflater.unused_data:
                            raise DeadLetter("corrupt", f"Content-Encoding {coding}: data after the end of the stream")
                        else:
                            block = inflater.unconsumed_tail
        except zlib.error as exc:
            raise DeadLetter("corrupt", f"not valid {coding} data (Content-Encoding {coding}): {exc}") from None
        if not inflater.eof:
            raise DeadLetter("truncated", f"the {coding} stream (Content-Encoding) ends early")
