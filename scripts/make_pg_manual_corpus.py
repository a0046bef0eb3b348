"""Build the PostgreSQL-manual corpus of the second golden set (golden/pg_manual.jsonl) from Debian's
postgresql-doc package, offline:

    apt-get install postgresql-doc-15
    .venv/bin/python scripts/make_pg_manual_corpus.py .corpora/pg_manual

It copies the SQL command reference, the server configuration chapter, the functions and data types chapters,
the explicit-locking page and the error-code appendix (about 260 HTML pages), unchanged.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

DEFAULT_HTML = Path("/usr/share/doc/postgresql-doc-15/html")
PATTERNS = ("sql-*.html", "runtime-config-*.html", "functions-*.html", "datatype-*.html", "explicit-locking.html",
            "errcodes-appendix.html")


def build(html: Path, target: Path) -> list[Path]:
    if not html.is_dir():
        raise SystemExit(f"{html} not found: install Debian's postgresql-doc-15 package (or pass --html)")
    target.mkdir(parents=True, exist_ok=True)
    copied = []
    for pattern in PATTERNS:
        for page in sorted(html.glob(pattern)):
            shutil.copy2(page, target / page.name)
            copied.append(target / page.name)
    return copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", type=Path)
    parser.add_argument("--html", type=Path, default=DEFAULT_HTML)
    args = parser.parse_args(argv)
    pages = build(args.html, args.target)
    print(f"{len(pages)} pages in {args.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
