"""Documents know what they are from their own content: title, organisation, kind and period read from the PDF's
metadata and its cover (rag_pipeline.text.identity), stored on the document, overridden by sidecars, shown by
`rag-pipeline doc` and in search results, said in every chunk's prefix, and matched by document routing, so a
file named by hash is found by its company's name."""

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from dagster import DagsterInstance

from rag_pipeline import store
from rag_pipeline.config import ParsingConfig
from rag_pipeline.defs.runs import run_ingest
from rag_pipeline.retrieval.search import SearchOptions, search
from rag_pipeline.text.identity import derive, label, period_label

from .conftest import FINANCEBENCH

REPO = Path(__file__).resolve().parent.parent

QUARTERLY_COVER = """## UNITED STATES
## SECURITIES AND EXCHANGE COMMISSION
# FORM 10-Q
## Quarterly report pursuant to Section 13 or 15(d) of the Securities Exchange Act of 1934
### For the quarterly period ended Commission file
### June 30, 2022 number 1-5805
Harbourline Logistics Corporation
(Exact name of registrant as specified in its charter)
### Delaware 13-2624428
The registrant's Annual Report on Form 10-K for the year ended December 31, 2021 describes its risks."""

REPORT_COVER = """NUMBERS, FACTS AND TRENDS SHAPING THE WORLD
FOR RELEASE JUNE 8, 2016
## BY Ana Example and Ben Sample
FOR MEDIA OR OTHER INQUIRIES:
Ana Example, Director of Research
www.example.org
RECOMMENDED CITATION: Example, Ana and Ben Sample. 2016. "Tide Gauges Show Faster Rise Along the Coast."
Washington, D.C.: Coastal Research Center, June."""


def test_a_forms_cover_gives_its_registrant_its_kind_and_the_quarter_it_ended():
    found = derive({"Title": "0001410636-22-000048", "Author": "EDGAR Online, a division of Donnelley Financial"},
                   [QUARTERLY_COVER], "3f9a1c77e0b24d8e.pdf")
    assert found.organisation == "Harbourline Logistics Corporation"
    # "Form 10-Q" comes before the cover's mention of the annual report: the earliest kind wins
    assert found.kind == "quarterly report"
    assert (found.year, found.quarter, found.period_end) == (2022, 2, "2022-06-30")
    # a filing number and a converter's stamp are not a title nor an organisation; the form's title is composed
    assert found.title == "Harbourline Logistics Corporation quarterly report for Q2 2022"
    assert found.found["organisation"] == "cover: registrant"
    assert period_label(found.to_json()) == "Q2 2022"


def test_a_reports_recommended_citation_gives_its_title_and_publisher_and_its_release_date_its_year():
    found = derive({}, [REPORT_COVER], "PH_2016.06.08_Economy-Final.pdf")
    assert found.title == "Tide Gauges Show Faster Rise Along the Coast"
    assert found.organisation == "Coastal Research Center"
    assert (found.year, found.period_end) == (2016, "2016-06-08")
    # a byline and a contact line are never the title
    assert "Ana Example" not in (found.title or "")


def test_metadata_that_reads_as_a_title_is_taken_and_a_tools_stamp_or_the_file_name_is_not():
    assert derive({"Title": "MacBook Air User's Guide (Manual)", "Author": "Apple Inc."}, ["Congratulations"],
                  "Macbook_air.pdf").to_json() | {"found": None} == {
        "title": "MacBook Air User's Guide (Manual)", "organisation": "Apple Inc.", "kind": "manual", "found": None}
    for stamp in ("Microsoft Word - draft3.docx", "untitled", "UG", "quarterly_results_2021"):
        assert derive({"Title": stamp}, [""], "quarterly_results_2021.pdf").found.get("title") != "pdf metadata"


def test_with_nothing_to_read_the_file_name_is_the_last_resort():
    found = derive({}, [""], "reports/ISEP_student_handbook_2020.pdf")
    assert found.title == "ISEP student handbook 2020"
    assert (found.kind, found.year) == ("handbook", 2020)
    assert found.found == {"kind": "file name", "period": "file name", "title": "file name"}
    # a number that only looks like a year in a hash or an arXiv id is not one
    assert derive({}, [""], "2310.05634v2.pdf").year is None


def test_kinds_are_configuration_and_a_bad_pattern_is_refused_with_its_kind():
    kinds = {"safety data sheet": (r"\bsafety\s+data\s+sheet\b",), **ParsingConfig().document_kinds}
    assert derive({}, ["# Safety Data Sheet\nAcetone"], "x.pdf", kinds).kind == "safety data sheet"
    with pytest.raises(ValueError, match="sds.*not a regular expression"):
        ParsingConfig(document_kinds={"sds": ("(unclosed",)})


def test_hostile_metadata_and_covers_are_bounded():
    huge = "Quarterly Results " * 100_000
    found = derive({"Title": huge, "Author": huge}, [huge, huge, huge, huge], "a.pdf")
    assert len(found.title or "") <= 200 and len(found.organisation or "") <= 200
    assert derive({"Title": None, 3: b"\x00"}, [], "").title is None  # nothing readable: nothing made up


def test_a_prefix_names_the_document_briefly():
    identity = {"title": "Tide Gauges Show Faster Rise Along the Coast", "organisation": "Coastal Research Center",
                "kind": "report", "year": 2016}
    assert label(identity, "fallback") == ("Tide Gauges Show Faster Rise Along the Coast (Coastal Research Center, "
                                           "2016)")
    long_title = {"title": " ".join(f"word{i}" for i in range(30))}
    assert label(long_title, "x").endswith("word11 …")
    assert label({}, "PH_2016_report") == "PH_2016_report"


@pytest.mark.financebench
def test_real_filings_are_known_by_their_registrant_and_fiscal_year():
    """Every development filing, read from its first three pages as the parser gives them, against the
    hand-checked truth (golden/document_identity.jsonl)."""
    import pdfplumber

    from rag_pipeline.parsing.pdf import document_metadata, parse_pdf

    truth = [json.loads(line) for line in (REPO / "golden" / "document_identity.jsonl").read_text().splitlines()]
    right = 0
    wanted = [t for t in truth if t["set"] == "financebench"]
    for t in wanted:
        path = FINANCEBENCH / "pdfs" / t["doc"]
        with pdfplumber.open(path) as pdf:
            metadata = document_metadata(pdf)
        pages = [page.markdown for page in itertools.islice(parse_pdf(path, None), 3)]
        found = derive(metadata, pages, "filing.pdf")  # the file name says nothing: content alone
        right += (found.kind == t["kind"] and found.year == t["period"]["year"]
                  and found.quarter == t["period"].get("quarter"))
        if found.found.get("organisation") == "cover: registrant":
            assert set(t["organisation"].lower().replace(",", " ").replace(".", " ").split()) <= set(
                found.organisation.lower().replace(",", " ").replace(".", " ").split()), (t["doc"], found)
    assert right == len(wanted)


def _cover_pdf(path: Path, cover: list[str], body: str, title: str | None = None) -> Path:
    from reportlab.pdfgen import canvas

    pdf = canvas.Canvas(str(path))
    if title:
        pdf.setTitle(title)
    y = 760
    for line in cover:
        pdf.setFont("Helvetica-Bold" if line.isupper() else "Helvetica", 12)
        pdf.drawString(72, y, line)
        y -= 18
    pdf.showPage()
    y = 760
    for sentence in body.split(". "):
        pdf.setFont("Helvetica", 10)
        pdf.drawString(72, y, sentence.strip()[:95])
        y -= 14
    pdf.showPage()
    pdf.save()
    return path


FILERS = {
    # file named by hash, registrant, fiscal year, what it sells
    "a41c9e0d.pdf": ("Harbourline Logistics Corporation", 2021, "container terminals and rail freight"),
    "b7f03d21.pdf": ("Harbourline Logistics Corporation", 2022, "container terminals and rail freight"),
    "c90e5f44.pdf": ("Quillfeather Paper Mills, Inc.", 2022, "coated paper and packaging board"),
    "d12b7a90.pdf": ("Saltmarsh Energy Holdings plc", 2021, "offshore wind and grid storage"),
    "e5c8d013.pdf": ("Saltmarsh Energy Holdings plc", 2022, "offshore wind and grid storage"),
    "f0a9b3c7.pdf": ("Brightwater Foods Limited", 2022, "frozen vegetables and ready meals"),
    "0b6e2d58.pdf": ("Kestrel Avionics Corporation", 2021, "flight control computers"),
    "1c4f8e29.pdf": ("Kestrel Avionics Corporation", 2022, "flight control computers"),
}


@pytest.fixture
def hash_named_filings(tmp_path, make_settings):
    root = tmp_path / "filings"
    root.mkdir()
    for name, (registrant, year, business) in FILERS.items():
        cover = ["UNITED STATES", "SECURITIES AND EXCHANGE COMMISSION", "FORM 10-K",
                 "ANNUAL REPORT PURSUANT TO SECTION 13 OR 15(d) OF THE SECURITIES EXCHANGE ACT OF 1934",
                 f"For the fiscal year ended December 31, {year}", registrant,
                 "(Exact name of registrant as specified in its charter)"]
        revenue = 400 + 13 * (year - 2020) + len(registrant)
        body = (f"The company sells {business} to customers in Europe and Asia. Revenue for the year was "
                f"${revenue} million. Operating margin improved on lower energy costs. The board approved a "
                f"dividend of ${year - 2000} cents a share. Capital expenditures went to new {business.split()[0]} "
                "capacity")
        _cover_pdf(root / name, cover, body, title="0001410636-22-000048")
    # a sidecar's word is over what the document says
    (root / "c90e5f44.pdf.meta.json").write_text(json.dumps({"title": "Quillfeather 2022 annual report",
                                                             "organisation": "Quillfeather"}))
    settings = make_settings([{"name": "filings", "root": str(root), "acl_labels": ["analysts"]}])
    with DagsterInstance.ephemeral() as instance:
        assert run_ingest(settings, instance=instance)["success"]
    return settings


def test_an_ingested_document_carries_its_identity_to_prefixes_results_routing_and_the_doc_command(
        hash_named_filings, db):
    rows = {path: (identity, ref) for path, identity, ref in db.execute(
        "SELECT rel_path, rag.document_identity(title, metadata, identity), ref FROM documents")}
    harbour, harbour_ref = rows["b7f03d21.pdf"]
    assert harbour["organisation"] == "Harbourline Logistics Corporation"
    assert (harbour["kind"], harbour["year"], harbour["period_end"]) == ("annual report", 2022, "2022-12-31")
    assert harbour["found"]["organisation"] == "cover: registrant"
    quill, _ = rows["c90e5f44.pdf"]
    assert (quill["title"], quill["organisation"]) == ("Quillfeather 2022 annual report", "Quillfeather")
    assert quill["found"]["title"] == quill["found"]["organisation"] == "sidecar"
    assert quill["year"] == 2022  # what the sidecar does not say still comes from the document

    # every chunk's prefix says whose report it is and for when
    prefixes = [p for (p,) in db.execute(
        "SELECT prefix FROM chunks c JOIN documents d USING (doc_id) WHERE d.rel_path = 'b7f03d21.pdf'")]
    assert prefixes and all("Harbourline Logistics Corporation" in p and "2022" in p for p in prefixes)

    # files named by hash are found by the company's name and the year, and results say what the document is
    options = SearchOptions.from_settings(hash_named_filings)
    version = store.versions.active_version(db)
    named = store.search.named_documents(db, version, "Harbourline Logistics revenue in 2022", ["analysts"],
                                         min_score=1.0, ratio=0.75, max_documents=5)
    paths = dict(db.execute("SELECT doc_id, rel_path FROM documents").fetchall())
    assert [paths[d] for d in named] == ["b7f03d21.pdf"]
    hits = search(db, "What was Harbourline Logistics' revenue in fiscal 2022?", ["analysts"], k=3, options=options)
    assert hits[0].path == "b7f03d21.pdf"
    assert hits[0].document["organisation"] == "Harbourline Logistics Corporation"
    assert "found" not in hits[0].document

    shown = subprocess.run([sys.executable, "-m", "rag_pipeline.cli", "--config",
                            str(hash_named_filings.config_file), "doc", f"#{harbour_ref}"],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "organisation: Harbourline Logistics Corporation  (cover: registrant)" in shown.stdout
    assert "year: 2022" in shown.stdout
