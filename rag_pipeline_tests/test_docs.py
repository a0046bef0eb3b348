"""The documentation stays a map: the README short enough to read, and the configuration reference in docs/ exactly
what its generator (scripts/config_reference.py) prints from the configuration's model, so it cannot go stale."""

from __future__ import annotations

from pathlib import Path

from scripts.config_reference import COMMAND, render

REPO = Path(__file__).resolve().parent.parent
README_MAX_LINES = 450


def test_the_configuration_reference_is_what_the_model_generates():
    committed = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert committed == render(), f"docs/configuration.md is stale: regenerate it with `{COMMAND}`"


def test_the_configuration_reference_names_every_key_of_the_model():
    from rag_pipeline.config import ENV_OVERRIDES, Settings

    page = render()
    for name, field in Settings.model_fields.items():
        if name != "config_file":
            assert f"`{field.alias or name}`" in page
    for variable in ENV_OVERRIDES:
        assert f"`{variable}`" in page


def test_the_readme_is_a_map_not_a_notebook():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/ (at most {README_MAX_LINES})"


def test_the_readme_links_every_docs_page():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    unlinked = sorted(page.name for page in (REPO / "docs").glob("*.md") if f"docs/{page.name}" not in readme)
    assert unlinked == []
