"""The README and docs/ stay short, start with the two commands, and link only to what exists
(``e2e/test_version.py`` runs ``flor --version``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import ROOT

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def markdown(page: Path) -> str:
    """The page without its code blocks: a `](` inside code is not a link."""
    return FENCE.sub("", page.read_text(encoding="utf-8"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m[1]) for m in re.finditer(r"^#+ (.+)$", markdown(page), re.M)}


def relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(markdown(page)) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_there_are_docs_pages_and_links_to_check():
    assert len(PAGES) >= 8
    assert sum(len(relative_links(p)) for p in PAGES) >= 20


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or not dest.is_relative_to(ROOT):  # nothing outside the repository
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page.name}: broken links {broken}"


@pytest.mark.parametrize("page", [*PAGES, *(ROOT / "flor").rglob("*.py"), *(ROOT / "examples").glob("*"),
                                  *(ROOT / "benchmarks").glob("*.py"), ROOT / "setup.py", ROOT / "tests" / "e2e" / "test_launch_ray.py"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_extras_are_installed_from_the_checkout(page: Path):
    """`pip install 'flor[s3]'` would install an unrelated PyPI package named flor."""
    if page.is_file():
        assert not re.search(r"flor\[\w+\]", page.read_text(encoding="utf-8")), page


def test_readme_opens_with_the_two_commands():
    lines = [ln.strip() for ln in README.read_text(encoding="utf-8").splitlines()]
    commands = [ln for ln in lines if re.match(r"(pip|python|bash) ", ln)][:2]
    assert commands[0].startswith("pip install torch==2.13.0 && pip install -e '.[examples]' && python examples/cnn.py")
    assert "--replay_flor" in commands[0] and "cnn_hindsight.py" in commands[0]
    assert commands[1].startswith("pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest")
    assert "--doctest-modules" in commands[1] and commands[1].endswith("tests flor")
    # CI runs the README's test command as it is written
    assert commands[1] in (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_readme_is_at_most_16000_bytes():
    assert len(README.read_bytes()) <= 16_000
