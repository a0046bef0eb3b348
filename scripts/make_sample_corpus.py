"""Regenerate the bundled sample corpus (sample_corpus/) for a fictional company, Northwind Robotics.

The generated files are committed; this script documents exactly how they were made. Needs the dev
extras (fpdf2) and python-docx (a Docling dependency).  Run: .venv/bin/python scripts/make_sample_corpus.py
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from docx import Document
from fpdf import FPDF

ROOT = Path(__file__).resolve().parent.parent / "sample_corpus"

SECURITY_PAGES = [
    (
        "1. Purpose and scope",
        [
            "This policy sets the minimum security practices for every Northwind Robotics employee, contractor "
            "and temporary worker who uses company laptops, source code repositories or the factory network.",
            "It applies at the Lyon assembly plant, the Austin design office and when working remotely. "
            "Exceptions must be approved in writing by the Chief Information Security Officer.",
        ],
    ),
    (
        "2. Passwords and multi-factor authentication",
        [
            "Passwords must be at least 14 characters long and must not be reused across services. A password "
            "manager is provided to every employee; storing passwords in spreadsheets or notes is forbidden.",
            "Multi-factor authentication is mandatory for e-mail, the VPN, the code forge and the HR portal. "
            "Hardware security keys are issued to administrators and to anyone with production access.",
        ],
    ),
    (
        "3. Reporting incidents",
        [
            "Suspected phishing messages must be forwarded to the security desk within one hour of receipt. "
            "Lost or stolen laptops must be reported the same day, so that the device can be wiped remotely.",
            "The security desk answers around the clock on extension 4400. Do not try to investigate an "
            "incident yourself and do not delete evidence such as suspicious e-mails or downloaded files.",
        ],
    ),
]

SEVERITY_TABLE = [
    ["Severity", "Example", "Response time"],
    ["Critical", "Ransomware on a factory controller", "15 minutes"],
    ["High", "Stolen laptop with customer data", "1 hour"],
    ["Medium", "Phishing e-mail clicked, no credentials entered", "4 hours"],
    ["Low", "Spam or a blocked malware download", "2 business days"],
]

REVENUE_TABLE = [
    ["Segment", "Q2 revenue (EUR m)", "Q3 revenue (EUR m)", "Change"],
    ["Warehouse robots", "41.2", "47.9", "+16%"],
    ["Welding arms", "28.4", "26.1", "-8%"],
    ["Service contracts", "12.7", "14.3", "+13%"],
    ["Total", "82.3", "88.3", "+7%"],
]


def _pdf() -> FPDF:
    pdf = FPDF(format="A4")
    pdf.set_auto_page_break(auto=True, margin=20)
    pdf.set_margins(20, 20, 20)
    return pdf


def _table(pdf: FPDF, rows: list[list[str]], widths: list[int]) -> None:
    pdf.set_font("Helvetica", size=10)
    for index, row in enumerate(rows):
        pdf.set_font("Helvetica", style="B" if index == 0 else "", size=10)
        for cell, width in zip(row, widths, strict=True):
            pdf.cell(width, 8, cell, border=1)
        pdf.ln(8)


def security_policy(path: Path) -> None:
    pdf = _pdf()
    for number, (heading, paragraphs) in enumerate(SECURITY_PAGES, 1):
        pdf.add_page()
        pdf.set_font("Helvetica", size=8)
        pdf.cell(0, 6, "Northwind Robotics - Information Security Policy - internal", new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", style="B", size=14)
        pdf.cell(0, 10, heading, new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("Helvetica", size=11)
        for paragraph in paragraphs:
            pdf.multi_cell(0, 6, paragraph, new_x="LMARGIN", new_y="NEXT")
            pdf.ln(3)
        if number == 3:
            pdf.ln(2)
            _table(pdf, SEVERITY_TABLE, [30, 95, 40])
        pdf.set_auto_page_break(auto=False)  # the footer sits in the bottom margin
        pdf.set_y(-15)
        pdf.set_font("Helvetica", size=8)
        pdf.cell(0, 6, f"Page {number} of {len(SECURITY_PAGES)}")
        pdf.set_auto_page_break(auto=True, margin=20)
    pdf.output(str(path))


def quarterly_report(path: Path) -> None:
    pdf = _pdf()
    pdf.add_page()
    pdf.set_font("Helvetica", style="B", size=16)
    pdf.cell(0, 10, "Q3 financial report", new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("Helvetica", size=11)
    pdf.multi_cell(
        0, 6,
        "Revenue grew seven percent quarter on quarter, driven by a large order of warehouse robots from a "
        "Nordic grocery chain. Welding arm sales declined as two automotive customers postponed line upgrades "
        "to next year. Gross margin improved to 38 percent thanks to lower battery cell prices.",
        new_x="LMARGIN", new_y="NEXT",
    )
    pdf.ln(4)
    _table(pdf, REVENUE_TABLE, [50, 40, 40, 25])
    pdf.add_page()
    pdf.set_font("Helvetica", style="B", size=14)
    pdf.cell(0, 10, "Outlook", new_x="LMARGIN", new_y="NEXT")
    pdf.set_font("Helvetica", size=11)
    pdf.multi_cell(
        0, 6,
        "For the fourth quarter we expect revenue between 90 and 94 million euros. Hiring is frozen outside "
        "the service organisation until the new Lyon paint shop is commissioned in February.",
        new_x="LMARGIN", new_y="NEXT",
    )
    pdf.output(str(path))


# The same notice closes several staff documents: the index keeps it once (near-duplicate detection).
NOTICE = (
    "This document is internal to Northwind Robotics. Do not forward it outside the company; if you find a "
    "printed copy in a public place, hand it to reception or to the security desk."
)

TRAVEL_POLICY = """# Travel and expenses policy

## Booking travel

Book all flights and hotels through the company travel portal at least 14 days before departure.
Economy class is the rule for flights under six hours; premium economy is allowed for longer flights.
Rail is preferred to air for trips under four hours between Lyon and Paris, Geneva or Turin.

## Daily allowances

| City group | Hotel cap per night | Meal allowance per day |
|---|---|---|
| Paris, London, Geneva | 220 EUR | 75 EUR |
| Other European cities | 150 EUR | 55 EUR |
| United States | 260 USD | 80 USD |

## Claiming expenses

Submit receipts in the expense tool within 30 days of returning. Claims older than 90 days are not
reimbursed. Alcohol is never reimbursed, except at client dinners approved by a director.

## Notice

""" + NOTICE + "\n"

FAQ_HTML = """<!DOCTYPE html>
<html><head><title>Warehouse robot FAQ</title></head>
<body>
<h1>NW-200 warehouse robot: frequently asked questions</h1>
<h2>How long does the battery last?</h2>
<p>A fully charged NW-200 runs for about nine hours of mixed picking work. Charging from empty to full
takes 95 minutes on the standard dock; the fast dock does it in 40 minutes.</p>
<h2>What payload can it carry?</h2>
<p>The NW-200 lifts shelves of up to 600 kg. Above 450 kg its top speed is reduced from 2 m/s to 1.2 m/s
to keep braking distances safe around people.</p>
<h2>Which floors does it need?</h2>
<p>Floors must be level within 5 mm over 3 metres. The robot navigates with floor-mounted QR markers, so
epoxy coatings must be matte; glossy floors confuse the downward camera.</p>
<h2>Notice</h2>
<p>""" + NOTICE + """</p>
</body></html>
"""

DRAFT_NOTES = """# Unreviewed notes

These notes have not been classified yet, so their sidecar gives them no ACL labels:
the pipeline must hold them back instead of indexing them.
"""


def onboarding_guide(path: Path) -> None:
    document = Document()
    document.add_heading("New starter onboarding guide", level=1)
    document.add_heading("Your first week", level=2)
    document.add_paragraph(
        "On your first morning, collect your badge and laptop from reception in building B. Your manager "
        "will walk you through the safety induction, which is required before you may enter the shop floor."
    )
    document.add_heading("Safety equipment", level=2)
    document.add_paragraph(
        "Steel-toe shoes and safety glasses are provided free of charge. Hearing protection is mandatory "
        "in the welding hall. Report any near miss in the safety app; reports can be anonymous."
    )
    document.add_heading("Who to ask", level=2)
    table = document.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text, table.rows[0].cells[1].text = "Topic", "Contact"
    for topic, contact in [("Payroll", "hr-payroll@northwind.example"), ("IT accounts", "extension 4100"),
                           ("Security incidents", "extension 4400")]:
        cells = table.add_row().cells
        cells[0].text, cells[1].text = topic, contact
    document.add_heading("Notice", level=2)
    document.add_paragraph(NOTICE)
    document.save(str(path))


def main() -> None:
    if ROOT.exists():
        shutil.rmtree(ROOT)
    for folder in ("handbook", "products", "finance", "drafts", "legacy"):
        (ROOT / folder).mkdir(parents=True)
    security_policy(ROOT / "handbook" / "security-policy.pdf")
    (ROOT / "handbook" / "travel-policy.md").write_text(TRAVEL_POLICY)
    onboarding_guide(ROOT / "handbook" / "onboarding-guide.docx")
    (ROOT / "products" / "nw200-faq.html").write_text(FAQ_HTML)
    quarterly_report(ROOT / "finance" / "q3-report.pdf")
    # Folder sidecar: finance documents are readable by the finance group only.
    (ROOT / "finance" / "_meta.json").write_text(json.dumps({"acl_labels": ["finance"], "department": "finance"}))
    (ROOT / "drafts" / "unreviewed-notes.md").write_text(DRAFT_NOTES)
    (ROOT / "drafts" / "unreviewed-notes.md.meta.json").write_text(json.dumps({"acl_labels": []}))
    # A truncated PDF: it must land in the dead-letter table, not crash the run.
    whole = (ROOT / "finance" / "q3-report.pdf").read_bytes()
    (ROOT / "legacy" / "scanned-contract.pdf").write_bytes(whole[: len(whole) // 2])
    print(f"wrote {sum(1 for p in ROOT.rglob('*') if p.is_file())} files under {ROOT}")


if __name__ == "__main__":
    main()
