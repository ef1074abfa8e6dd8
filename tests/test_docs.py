"""The user-facing pages: links that resolve, no pointer outside the repository, and the
generated API reference in step with the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(page: Path) -> None:
    text = page.read_text()
    assert "../shared" not in text
    for target in LINK.findall(text):
        if target.startswith(("http://", "https://", "#", "mailto:")):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        assert path.is_relative_to(ROOT), f"{page.name}: {target} points outside the repository"
        assert path.exists(), f"{page.name}: {target} does not exist"


def test_readme_anchors_exist() -> None:
    """Every `(#anchor)` in the README names one of its headings (GitHub's slug rule)."""
    text = (ROOT / "README.md").read_text()
    slugs = set()
    for heading in re.findall(r"^#+ (.+)$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        slugs.add(slug)
    for anchor in re.findall(r"\]\(#([^)]+)\)", text):
        assert anchor in slugs, f"README link #{anchor} names no heading"


def test_api_reference_is_current() -> None:
    from burn_remote._apiref import render

    page = ROOT / "docs" / "reference.md"
    assert page.read_text() == render(), (
        "docs/reference.md is stale: run `python -m burn_remote._apiref > docs/reference.md`"
    )


def test_every_public_class_and_function_has_a_docstring() -> None:
    from burn_remote._apiref import undocumented, undocumented_methods

    assert undocumented() == []
    assert undocumented_methods() == []  # help(Module.state_dict) says what it returns
