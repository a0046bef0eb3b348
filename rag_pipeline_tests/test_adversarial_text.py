"""Text from sources is untrusted: no pattern or text function may take super-linear time on it. Every compiled
pattern of the modules that read document text, and the functions built on them, run on crafted 100 KB lines
(long runs of whitespace of every class, dot leaders, hashes, pipes, digits, glyph tokens, URLs). A quadratic
pattern takes about a minute on these; the bound below is twenty times what a linear one needs here."""

import importlib
import re
import time

import pytest

N = 100_000
CRAFTED = {
    "spaces": "a" + " " * N + "b",
    "line separators": "# a" + "\u2028" * N + "b",
    "mixed whitespace": "x" + "\u2003\u00a0\t\u3000\u205f" * (N // 5) + "y",
    "leader": "x" + ". " * (N // 2) + "z",
    "middle dots": "x" + "· " * (N // 2) + "z",
    "hashes": "#" * N + " x",
    "figures": "1," * (N // 2) + "x",
    "pipes": "| ---" * (N // 5) + "x",
    "glyph tokens": "(cid:12)" * (N // 8) + "x",
    "roles": "system:" * (N // 7),
    "words": "ignore previous " * (N // 16),
    "url": "http://" + "a" * N,
    "letters": "a" * N,
    "urls": "http://a " * (N // 9),
}
MODULES = ("rag_pipeline.text.cleaning", "rag_pipeline.text.chunking", "rag_pipeline.text.safety", "rag_pipeline.parsing.formats",
           "rag_pipeline.parsing.tables", "rag_pipeline.text.language", "rag_pipeline.parsing.rtl", "rag_pipeline.endpoints.redaction",
           "rag_pipeline.text.identity", "rag_pipeline.retrieval.periods", "rag_pipeline.parsing.pictures")
BOUND_SECONDS = 2.0


def _patterns():
    for name in MODULES:
        module = importlib.import_module(name)
        for attribute, value in vars(module).items():
            if isinstance(value, re.Pattern):
                yield f"{name}.{attribute}", value
            elif isinstance(value, dict):
                for key, item in value.items():
                    if isinstance(item, re.Pattern):
                        yield f"{name}.{attribute}[{key}]", item


@pytest.mark.parametrize(("name", "pattern"), list(_patterns()), ids=lambda value: value if isinstance(value, str) else "")
def test_every_pattern_is_linear_on_crafted_lines(name, pattern):
    for case, text in CRAFTED.items():
        started = time.perf_counter()
        pattern.search(text)
        pattern.sub("", text)
        assert time.perf_counter() - started < BOUND_SECONDS, f"{name} on {case}"


def test_text_functions_are_linear_on_crafted_lines():
    from rag_pipeline.endpoints.redaction import redact
    from rag_pipeline.parsing.rtl import logical_text
    from rag_pipeline.parsing.tables import find_tables
    from rag_pipeline.retrieval.periods import asked_period
    from rag_pipeline.text.chunking import sections_of
    from rag_pipeline.text.cleaning import clean_text, is_toc_leader_line
    from rag_pipeline.text.identity import derive
    from rag_pipeline.text.safety import injection_flags

    functions = {
        "clean_text": clean_text,
        "is_toc_leader_line": is_toc_leader_line,
        "sections_of": lambda text: sections_of([(1, text)]),
        "injection_flags": injection_flags,
        "redact": lambda text: redact(text, "http://a/secret"),
        "logical_text": logical_text,
        # a cover three times over, the metadata too: the identity reads at most the first pages' first characters
        "derive": lambda text: derive({"Title": text, "Author": text}, [text, text, text], text[:200] + ".pdf"),
        "asked_period": asked_period,
        "find_tables": lambda text: find_tables([{"text": word, "x0": 10.0 * i, "x1": 10.0 * i + 8, "top": 0,
                                                  "bottom": 9} for i, word in enumerate(text.split()[:5000])]),
    }
    for name, function in functions.items():
        for case, text in CRAFTED.items():
            started = time.perf_counter()
            function(text)
            assert time.perf_counter() - started < BOUND_SECONDS, f"{name} on {case}"
