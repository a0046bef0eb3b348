"""Document-aware ranking: among look-alike filings (same template, other numbers), a question that names the
company and the period is answered from that filing; on pages named by their topic, a query word shared with a
file name routes nothing."""

import itertools

import pytest
from dagster import DagsterInstance

from rag_pipeline import store
from rag_pipeline.config import RoutingConfig
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.domain import ids
from rag_pipeline.retrieval.search import SearchOptions, search

# name in the file, name in the text (None: the text never names the company), business
COMPANIES = {
    "ACME": (None, "industrial robots"),
    "GLOBEX": ("Globex", "chemical coatings"),
    "ACUTEK": ("Acu-Tek", "payroll software"),  # a hyphenated name, squashed in the file name
    "BLUEHARBOR": ("Blue Harbor", "container shipping"),  # file names squash two-word names
    "NORTHWINDTRADERS": ("Northwind Traders", "food distribution"),  # analysts also say "Northwind"
}
YEARS = (2018, 2019, 2020)
NAMED = dict(min_score=2.0, ratio=0.75, max_documents=5)


def _filing(company: str, year: int) -> str:
    said, business = COMPANIES.get(company, (company.title(), "office furniture"))
    said = said or "The company"
    revenue = 100 + 7 * YEARS.index(year) + sum(map(ord, company))  # figures differ: no near-duplicates
    return (
        f"# Annual report\n\n## Item 1. Business\n\n{said} designs and sells {business} to customers in North "
        f"America and Europe. {said} operates two segments and employs about four thousand people.\n\n"
        "## Item 7. Management's discussion and analysis\n\n"
        f"Total revenue of {said} for fiscal {year} was ${revenue} million, compared with {year - 1}. Operating "
        "margin improved on lower input costs and a better product mix. Capital expenditures were mostly for new "
        "plants.\n"
    )


def _ingest(make_settings, root, labels):
    settings = make_settings([{"name": root.name, "root": str(root), "acl_labels": labels}])
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    return settings


@pytest.fixture
def filings(tmp_path, make_settings):
    root = tmp_path / "filings"
    root.mkdir()
    for company, year in itertools.product(COMPANIES, YEARS):
        (root / f"{company}_{year}_10K.md").write_text(_filing(company, year))
    return _ingest(make_settings, root, ["analysts"])


def _named(db, question, labels=("analysts",)):
    version = store.versions.active_version(db)
    return store.search.named_documents(db, version, question, labels, **NAMED)


def test_a_question_naming_a_filing_is_answered_from_it(filings, db):
    assert RoutingConfig().enabled  # on by default: a topic word shared with a name routes nothing (test below)
    routed = SearchOptions(routing=RoutingConfig(enabled=True))
    unrouted = SearchOptions(routing=RoutingConfig(enabled=False))
    right = {"routed": 0, "unrouted": 0}
    for company, year in itertools.product(COMPANIES, YEARS):
        name = COMPANIES[company][0] or company
        question = f"What was {name}'s total revenue in FY{year}? Answer from the management discussion."
        assert _named(db, question) == [ids.doc_id("filings", f"{company}_{year}_10K.md")], (company, year)
        for setting, options in (("routed", routed), ("unrouted", unrouted)):
            top = search(db, question, ["analysts"], k=1, options=options)[0]
            right[setting] += top.path == f"{company}_{year}_10K.md"
    assert right["routed"] == len(COMPANIES) * len(YEARS) > right["unrouted"], right


def test_a_company_named_without_a_period_routes_to_all_its_filings(filings, db):
    expected = sorted(ids.doc_id("filings", f"GLOBEX_{year}_10K.md") for year in YEARS)
    version = store.versions.active_version(db)
    # min_score 1: in 12 filings a name three of them carry is worth an idf of 1.3 (2.5 among 40)
    named = store.search.named_documents(db, version, "How does Globex describe its business?", ("analysts",),
                                         **{**NAMED, "min_score": 1.0})
    assert sorted(named) == expected


def test_a_period_and_a_short_name_as_analysts_write_them(filings, db):
    northwind_2019 = [ids.doc_id("filings", "NORTHWINDTRADERS_2019_10K.md")]
    for question in ("What was Northwind Traders' total revenue in FY19?",  # a two-digit fiscal year
                     "What was Northwind Traders' total revenue in FY'19?",
                     "Northwind revenue FY2019",  # the first word of a squashed name
                     "How did Northwind's operating margin change in FY19?"):
        assert _named(db, question) == northwind_2019, question
    assert _named(db, "What was Globex's total revenue in FY20?") == [ids.doc_id("filings", "GLOBEX_2020_10K.md")]


def test_period_years_and_name_prefixes_are_read_narrowly(db):
    years = dict(db.execute("SELECT w, rag.period_year(w) FROM unnest(%s::text[]) AS w",
                            (["FY22", "fy'22", "Q3FY23", "1Q22", "H1-22", "FY98,", "FY2022", "2022", "Q2", "FYI"],))
                 .fetchall())
    assert years == {"FY22": "2022", "fy'22": "2022", "Q3FY23": "2023", "1Q22": "2022", "H1-22": "2022",
                     "FY98,": "1998", "FY2022": None, "2022": None, "Q2": None, "FYI": None}
    prefixes = db.execute("SELECT rag_name_prefixes(p) FROM unnest(%s::text[]) AS p",
                          (["MGMRESORTS_2022_10K.pdf", "datatype-uuid.html", "3M_2018_10K.pdf", "PEPSICO"],)).fetchall()
    # capitalised squashed parts of 7+ letters give their first 3..n-3 letters; words split by separators nothing
    assert [r[0] for r in prefixes] == ["MGM MGMR MGMRE MGMRES MGMRESO", "", "", "PEP PEPS"]


def test_routing_respects_labels_and_needs_a_naming_word(filings, db):
    assert _named(db, "Globex FY2019 revenue", labels=("nobody",)) == []
    assert _named(db, "total revenue for the year") == []
    assert _named(db, "revenue in 2019") == []  # a period alone: a third of the names carry it


@pytest.fixture
def manual(tmp_path, make_settings):
    """Pages named by their topic, whose topic words are said on every page (as in a product manual)."""
    root = tmp_path / "manual"
    root.mkdir()
    topics = ["create-table", "create-index", "update", "query-planning", "delete", "vacuum", "backup", "locks"]
    for topic in topics:
        words = topic.replace("-", " ")
        (root / f"sql-{topic}.md").write_text(
            f"# {words.title()}\n\nThis page explains {words}. Create a table first, then query it; an update or "
            "a delete changes rows, and an index makes a query faster. To create an index on a table, name its "
            f"columns. Every query plan is different. The {words} command takes locks.\n")
    return _ingest(make_settings, root, ["docs"])


def test_a_topic_word_shared_with_a_page_name_routes_nothing(manual, db):
    version = store.versions.active_version(db)
    loose = {**NAMED, "min_score": 1.0}  # eight pages: one name word is worth at most ln 6 = 1.8
    for question in ("How do I create a role?", "Why is my query slow after an update?",
                     "Which locks does a delete take?"):
        assert store.search.named_documents(db, version, question, ("docs",), **loose) == [], question
    # what keeps them out is where the word is said: counted by name alone, "create" names both create pages
    assert len(store.search.named_documents(db, version, "How do I create a role?", ("docs",), **loose,
                                            min_concentration=0.0)) == 2


def test_routing_names_only_documents_the_caller_may_read(tmp_path, make_settings, db):
    sources = []
    public_companies = ("GLOBEX", "ACME", "UMBRA", "KESTREL", "HELIX")
    for name, labels, companies in (("public", ["analysts"], public_companies), ("board", ["board"], ("GLOBEX",))):
        root = tmp_path / name
        root.mkdir()
        for company, year in itertools.product(companies, (2019, 2020)):
            (root / f"{company}_{year}_10K.md").write_text(_filing(company, year))
        sources.append({"name": name, "root": str(root), "acl_labels": labels})
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(make_settings(sources), instance=instance)["success"]
    version = store.versions.active_version(db)
    question = "What was Globex's total revenue in FY2019?"

    def named(*labels):
        return sorted(store.search.named_documents(db, version, question, labels, **{**NAMED, "min_score": 1.0}))

    public, board = ids.doc_id("public", "GLOBEX_2019_10K.md"), ids.doc_id("board", "GLOBEX_2019_10K.md")
    assert named("analysts") == [public]
    assert named("board") == [board]
    assert named("analysts", "board") == sorted([public, board])
    assert named("nobody") == []
