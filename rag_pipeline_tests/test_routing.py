"""Document-aware ranking: among look-alike filings (same template, other numbers), a question that names the
company and the period is answered from that filing."""

import itertools

import pytest
from dagster import DagsterInstance

from rag_pipeline import ids
from rag_pipeline.config import RoutingConfig
from rag_pipeline.retrieval import SearchOptions, search
from rag_pipeline.runs import run_ingest
from rag_pipeline.store import search as search_store

COMPANIES = {"ACME": "industrial robots", "GLOBEX": "chemical coatings", "INITECH": "payroll software"}
YEARS = (2018, 2019, 2020)


def _filing(company: str, year: int, business: str) -> str:
    revenue = 100 + 7 * YEARS.index(year) + 31 * list(COMPANIES).index(company)
    return (
        f"# Annual report\n\n## Item 1. Business\n\nThe company designs and sells {business} to customers in North "
        "America and Europe. It operates two segments and employs about four thousand people.\n\n"
        "## Item 7. Management's discussion and analysis\n\n"
        f"Total revenue for the fiscal year was ${revenue} million, compared with the prior year. Operating margin "
        "improved on lower input costs and a better product mix. Capital expenditures were mostly for new plants.\n"
    )


@pytest.fixture
def filings(tmp_path, make_settings):
    root = tmp_path / "filings"
    root.mkdir()
    for (company, business), year in itertools.product(COMPANIES.items(), YEARS):
        (root / f"{company}_{year}_10K.md").write_text(_filing(company, year, business))
    settings = make_settings([{"name": "filings", "root": str(root), "acl_labels": ["analysts"]}])
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    return settings


def test_a_question_naming_a_filing_is_answered_from_it(filings, db):
    assert not RoutingConfig().enabled  # on where names identify documents, as here
    routed = SearchOptions(routing=RoutingConfig(enabled=True))
    unrouted = SearchOptions(routing=RoutingConfig(enabled=False))
    right = {"routed": 0, "unrouted": 0}
    for company, year in itertools.product(COMPANIES, YEARS):
        question = f"What was {company}'s total revenue in FY{year}? Answer from the management discussion."
        named = search_store.named_documents(db, question, ("analysts",), min_score=2.0, ratio=0.75, max_documents=5)
        assert named == [ids.doc_id("filings", f"{company}_{year}_10K.md")], (company, year)
        for name, options in (("routed", routed), ("unrouted", unrouted)):
            top = search(db, question, ["analysts"], k=1, options=options)[0]
            right[name] += top.path == f"{company}_{year}_10K.md"
    assert right["routed"] == len(COMPANIES) * len(YEARS) >= right["unrouted"], right


def test_routing_respects_labels_and_needs_a_naming_term(filings, db):
    assert search_store.named_documents(db, "ACME FY2019 revenue", ("nobody",), min_score=2.0, ratio=0.75,
                                        max_documents=5) == []
    assert search_store.named_documents(db, "total revenue for the year", ("analysts",), min_score=2.0, ratio=0.75,
                                        max_documents=5) == []
