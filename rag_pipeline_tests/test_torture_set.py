import pytest

from rag_pipeline_tests.conftest import TORTURE
from torture_set.harness import run


@pytest.mark.skipif(not (TORTURE / "manifest.csv").exists(), reason="shared/torture is not beside the checkout")
def test_every_torture_document_is_parsed_or_dead_lettered_as_expected():
    results = run(TORTURE)
    assert len(results) == 15
    failures = [(r.file, r.outcome, r.expected, r.pages, r.chars) for r in results if not r.passed]
    assert failures == []
    assert not [r for r in results if r.outcome.startswith("crash")]
