"""Figure chunks: one chunk per picture a page's parse found (rag_pipeline.parsing.pictures), saying its caption and
the words drawn inside it (a chart's title, axis labels, legend and data labels), in the section of the page it is
on (content_type `figure`). The same words are in the page's text too, scattered among the prose; said together,
after the caption, they are found by a question about the chart. Deterministic: the same pictures give the same
chunks, with or without a model.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence

from rag_pipeline.domain import ids
from rag_pipeline.parsing.pictures import CAPTION_RE, Picture, without_furniture
from rag_pipeline.text.chunking import Chunk

CONTENT_TYPE = "figure"
# A figure chunk's first line says what it is: its caption when that says so ("Figure 3: …", "Chart 2 …"), else
# this word before the caption (a chart's title) or alone
FIGURE_WORD = "Figure"
# What introduces a model's description in the chunk: derived text, said as such
DESCRIPTION_WORD = "Described"
# Words a picture must hold besides its caption: an image with a caption only is said by the page's text already.
MIN_WORDS = 4


def figure_text(picture: Picture) -> str | None:
    """What a figure chunk says: a first line naming it a figure (with its caption), then the words inside it line
    by line, then a model's description of it when one was asked for (last: the rest is the same with or without a
    model); None when it holds fewer than MIN_WORDS words of its own and no description."""
    lines = [" ".join(line.split()) for line in picture.text.split("\n")]
    lines = [line for line in lines if line and line != picture.caption]
    description = " ".join((picture.description or "").split())
    if sum(len(line.split()) for line in lines) < MIN_WORDS and not description:
        return None
    caption = picture.caption or ""
    head = caption if CAPTION_RE.match(caption) else f"{FIGURE_WORD}: {caption}" if caption else FIGURE_WORD
    return "\n".join([head, *lines, *([f"{DESCRIPTION_WORD}: {description}"] if description else [])])


def _sections_by_page(chunks: Sequence[Chunk]) -> Callable[[int], str]:
    """The section in force on a page: that of the last chunk that starts on or before it (found by bisection:
    a long document may have many pictures)."""
    starts = [chunk.page_start for chunk in chunks]
    paths = [chunk.section_path for chunk in chunks]

    def on(page: int) -> str:
        index = bisect.bisect_right(starts, page)
        return paths[index - 1] if index else ""

    return on


def figure_chunks(doc_id: str, chunker_version: str, pictures: Sequence[Picture], chunks: Sequence[Chunk],
                  count_tokens: Callable[[str], int], cut: Callable[[str, int], str], max_tokens: int) -> list[Chunk]:
    """A chunk for each picture that says something (page furniture left out: a logo on every page), numbered after
    `chunks` (the document's text chunks, in order), its text cut to `max_tokens` (`cut(text, tokens)`, the
    embedding model's tokenizer)."""
    ordered = sorted(without_furniture(pictures), key=lambda p: (p.page, p.box[1], p.box[0]))
    section_on = _sections_by_page(chunks)
    out: list[Chunk] = []
    for picture in ordered:
        text = figure_text(picture)
        if text is None:
            continue
        text = cut(text, max_tokens).strip()
        text_hash = ids.text_hash(text)
        ordinal = len(chunks) + len(out)
        out.append(Chunk(
            chunk_id=ids.chunk_id(doc_id, chunker_version, ordinal, text_hash),
            ordinal=ordinal,
            text=text,
            section_path=section_on(picture.page),
            page_start=picture.page,
            page_end=picture.page,
            content_type=CONTENT_TYPE,
            token_count=count_tokens(text),
            content_hash=text_hash,
        ))
    return out
