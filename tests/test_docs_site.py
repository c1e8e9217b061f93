"""The documentation site builds with MkDocs, strictly: with no warning today, and a broken
link, anchor or page fails the build (each case on a copy of the docs, so the check is seen
to fail)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MKDOCS = Path(sys.executable).parent / "mkdocs"


def build(root: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` of the site whose mkdocs.yml is in ``root``, as `make site`."""
    config = root / "mkdocs.yml"
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # the Makefile says why
        capture_output=True,
        text=True,
        timeout=120,
    )


def warnings(result: subprocess.CompletedProcess[str]) -> list[str]:
    output = result.stdout + result.stderr
    return [line for line in output.splitlines() if line.startswith(("WARNING", "ERROR"))]


def test_the_site_builds_with_no_warning_and_the_readme_as_its_front_page(
    tmp_path: Path,
) -> None:
    """mkdocs build --strict passes, says nothing at warning level, and the front page is
    the README's, its links to the pages working."""
    result = build(REPO, tmp_path / "site")
    assert (result.returncode, warnings(result)) == (0, []), result.stderr
    front = (tmp_path / "site" / "index.html").read_text()
    assert "The two commands" in front
    assert 'href="install.html"' in front  # the README's docs/install.md, from docs/


def add_link(target: str) -> Callable[[Path], None]:
    def broken(docs: Path) -> None:
        page = docs / "troubleshooting.md"
        page.write_text(page.read_text() + f"\nSee [this]({target}).\n")

    return broken


def add_page_outside_the_nav(docs: Path) -> None:
    (docs / "stray.md").write_text("# Stray\n\nA page nobody can reach from the menu.\n")


@pytest.mark.parametrize(
    ("breaking", "said"),
    [
        (add_link("no-such-page.md"), "no-such-page.md"),
        (add_link("clients.md#no-such-heading"), "#no-such-heading"),
        (add_link("#no-such-heading"), "#no-such-heading"),
        (add_link("../README.md#no-such-heading"), "#no-such-heading"),
        (add_link("../deploy/no-such-file.yaml"), "no-such-file.yaml"),
        (add_link("/troubleshooting.md"), "/troubleshooting.md"),
        (add_page_outside_the_nav, 'not included in the "nav"'),
    ],
    ids=[
        "page",
        "anchor",
        "anchor-here",
        "front-page-anchor",
        "repository-file",
        "absolute",
        "not-in-nav",
    ],
)
def test_a_broken_link_or_a_stray_page_fails_the_build(
    tmp_path: Path, breaking: Callable[[Path], None], said: str
) -> None:
    """A copy of the repository's docs, broken in one way, fails to build, and each warning
    is about that one thing."""
    root = tmp_path / "repo"
    root.mkdir()
    for entry in REPO.iterdir():
        if entry.name == "docs":
            shutil.copytree(entry, root / "docs")
        else:
            (root / entry.name).symlink_to(entry)
    breaking(root / "docs")
    result = build(root, tmp_path / "site")
    assert result.returncode != 0
    assert warnings(result) != []
    assert all(said in line for line in warnings(result)), warnings(result)
