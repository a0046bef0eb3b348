"""Figure chunks: one chunk per picture a page's parse found (rag_pipeline.parsing.pictures), saying its caption and
the words drawn inside it (a chart's title, axis labels, legend and data labels), in the section of the page it is
on. The same words are in the page's text too, scattered among the prose; said together, under "Figure", they are
found by a question about the chart. Deterministic: the same pictures give the same chunks, with or without a model.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rag_pipeline.domain import ids
from rag_pipeline.parsing.pictures import Picture, without_furniture
from rag_pipeline.text.chunking import SECTION_SEPARATOR, Chunk

FIGURE_SECTION = "Figure"  # the innermost section of a figure chunk: its prefix says what the chunk is
CONTENT_TYPE = "figure"
# Words a picture must hold besides its caption: an image with a caption only is said by the page's text already.
MIN_WORDS = 4


def figure_text(picture: Picture) -> str | None:
    """What a figure chunk says: its caption, then the words inside it line by line; None when it holds fewer than
    MIN_WORDS words of its own."""
    lines = [" ".join(line.split()) for line in picture.text.split("\n")]
    lines = [line for line in lines if line and line != picture.caption]
    if sum(len(line.split()) for line in lines) < MIN_WORDS:
        return None
    return "\n".join([picture.caption, *lines] if picture.caption else lines)


def _section_on(page: int, chunks: Sequence[Chunk]) -> str:
    """The section in force on a page: that of the last chunk that starts on or before it."""
    path = ""
    for chunk in chunks:
        if chunk.page_start > page:
            break
        path = chunk.section_path
    return path


def figure_chunks(doc_id: str, chunker_version: str, pictures: Sequence[Picture], chunks: Sequence[Chunk],
                  count_tokens: Callable[[str], int], max_tokens: int) -> list[Chunk]:
    """A chunk for each picture that says something (page furniture left out: a logo on every page), numbered after
    `chunks` (the document's text chunks, in order), its text cut by whole lines to `max_tokens`."""
    ordered = sorted(without_furniture(pictures), key=lambda p: (p.page, p.box[1], p.box[0]))
    out: list[Chunk] = []
    for picture in ordered:
        text = figure_text(picture)
        if text is None:
            continue
        lines = text.split("\n")
        while len(lines) > 1 and count_tokens("\n".join(lines)) > max_tokens:
            lines.pop()
        words = lines[-1].split()
        while len(words) > 1 and count_tokens("\n".join([*lines[:-1], " ".join(words)])) > max_tokens:
            words.pop()  # one line longer than a chunk: its first words
        text = "\n".join([*lines[:-1], " ".join(words)])
        section = _section_on(picture.page, chunks)
        text_hash = ids.text_hash(text)
        ordinal = len(chunks) + len(out)
        out.append(Chunk(
            chunk_id=ids.chunk_id(doc_id, chunker_version, ordinal, text_hash),
            ordinal=ordinal,
            text=text,
            section_path=SECTION_SEPARATOR.join(part for part in (section, FIGURE_SECTION) if part),
            page_start=picture.page,
            page_end=picture.page,
            content_type=CONTENT_TYPE,
            token_count=count_tokens(text),
            content_hash=text_hash,
        ))
    return out
