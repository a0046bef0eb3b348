import pytest

from rag_pipeline.chunking import Chunker, sections_of, template_prefix, truncate_to_tokens
from rag_pipeline.cleaning import clean_text, content_hash
from rag_pipeline.embedding import load_tokenizer, max_sequence_length, resolve_model


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(resolve_model("all-MiniLM-L6-v2").location)


def test_clean_text_normalises_representation_only():
    raw = "Ｆｕｌｌ\u00a0width\tand  spaces \r\n\r\n\r\n\r\nﬁne\x00 line   \n"
    assert clean_text(raw) == "Full width and spaces\n\nfine line"


def test_content_hash_depends_on_text_and_page_boundaries():
    assert content_hash(["a", "b"]) == content_hash(["a", "b"])
    assert content_hash(["a", "b"]) != content_hash(["ab"])
    assert content_hash(["a"]) != content_hash(["b"])


def test_sections_follow_headings_across_pages():
    pages = [(1, "# Guide\nintro\n## Setup\nstep one"), (2, "step two\n# Appendix\n## Terms\nwords")]
    sections = sections_of(pages)
    assert [(s.page, s.path) for s in sections] == [
        (1, ("Guide",)),
        (1, ("Guide", "Setup")),
        (2, ("Guide", "Setup")),
        (2, ("Appendix", "Terms")),  # heading directly followed by a sub-heading: no heading-only section
    ]


def test_model_limits_from_the_packaged_model():
    assert max_sequence_length(resolve_model("all-MiniLM-L6-v2").location) == 256


def test_chunks_fit_the_token_budget_and_are_stable(tokenizer):
    paragraph = "The warehouse robot carries shelves between picking stations. " * 12
    text = "# Manual\n" + "\n\n".join(paragraph for _ in range(8))
    chunker = Chunker(tokenizer, max_tokens=100)
    chunks = chunker.chunk("doc1", [(1, text), (2, "| a | b |\n|---|---|\n| 1 | 2 |")])
    assert len(chunks) > 8
    assert all(c.token_count <= 100 for c in chunks)
    assert [c.ordinal for c in chunks] == list(range(len(chunks)))
    assert chunks[0].section_path == "Manual" and chunks[0].page_start == 1
    assert chunks[-1].content_type == "table" and chunks[-1].page_start == 2
    again = chunker.chunk("doc1", [(1, text), (2, "| a | b |\n|---|---|\n| 1 | 2 |")])
    assert [c.chunk_id for c in again] == [c.chunk_id for c in chunks]
    assert Chunker(tokenizer, max_tokens=90).version != chunker.version
    other_doc = chunker.chunk("doc2", [(1, text)])
    assert other_doc[0].chunk_id != chunks[0].chunk_id


def test_prefix_template_and_truncation(tokenizer):
    assert template_prefix("Handbook", "Travel › Hotels", 3, 3) == "Handbook › Travel › Hotels › p. 3"
    assert template_prefix(None, "", 1, 2) == "pp. 1-2"
    long = "word " * 100
    cut = truncate_to_tokens(tokenizer, long, 10)
    assert len(tokenizer.encode(cut, add_special_tokens=False)) <= 10


def test_invalid_chunker_settings(tokenizer):
    with pytest.raises(ValueError):
        Chunker(tokenizer, max_tokens=8)
    with pytest.raises(ValueError):
        Chunker(tokenizer, max_tokens=100, overlap_tokens=100)
