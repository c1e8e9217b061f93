"""MkDocs hooks: the README is the site's front page, and links out of docs/ are checked.

The README and these pages are read on GitHub and in a checkout as often as on the site, so
they link by relative path: the README to `docs/install.md` and `deploy/...`, a page to
`../deploy/caddy/Caddyfile`. The site holds docs/ alone, and MkDocs would call every link out
of it missing. So:

- docs/index.md is replaced by the README, its links rebased from the repository's root onto
  docs/: the front page is written once.
- A link out of docs/ to the README becomes a link to the front page. Any other must name a
  file or folder of the repository (if not, a warning, which `mkdocs build --strict` makes an
  error, as it does a missing page or anchor); the site has no copy of it, so it shows the
  link's text.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.plugins import get_plugin_logger
from mkdocs.structure.pages import Page

log = get_plugin_logger(__name__)

# An inline link or image, `[text](target)`: the only kind these pages use.
LINK = re.compile(r"(?P<bang>!?)\[(?P<text>[^\]]*)\]\((?P<target>[^()\s]+)\)")
FRONT_PAGE = "README.md"


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, **_: Any) -> str:
    root = Path(config.config_file_path).parent
    docs = Path(config.docs_dir).relative_to(root).as_posix()
    here = posixpath.dirname(page.file.src_uri)
    if page.file.src_uri == "index.md":
        markdown = relink((root / FRONT_PAGE).read_text(), lambda m: rebased(m, docs))

    def outward(link: re.Match[str]) -> str:
        target = urlsplit(link["target"])
        if target.scheme or target.netloc or not target.path:
            return link[0]
        path = posixpath.normpath(posixpath.join(here, target.path))
        if not path.startswith("../"):
            return link[0]  # inside docs/: MkDocs checks it
        in_repo = posixpath.normpath(posixpath.join(docs, path))
        if in_repo == FRONT_PAGE:
            front = posixpath.relpath("index.md", here or ".")
            return f"{link['bang']}[{link['text']}]({front}{fragment(target.fragment)})"
        if not (root / in_repo).exists():
            log.warning(
                f"Doc file '{page.file.src_uri}' contains a link '{link['target']}', "
                f"but '{in_repo}' is not in the repository."
            )
            return link[0]
        return link["text"]

    return relink(markdown, outward)


def rebased(link: re.Match[str], docs: str) -> str:
    """The README's link, written from docs/ rather than from the repository's root."""
    target = urlsplit(link["target"])
    if target.scheme or target.netloc or not target.path or target.path.startswith("/"):
        return link[0]
    path = posixpath.relpath(posixpath.normpath(target.path), docs)
    return f"{link['bang']}[{link['text']}]({path}{fragment(target.fragment)})"


def fragment(anchor: str) -> str:
    return f"#{anchor}" if anchor else ""


def relink(markdown: str, replace: Callable[[re.Match[str]], str]) -> str:
    """``markdown`` with each link outside fenced code blocks replaced (a link's text may
    run over a line break, so prose is matched a paragraph run at a time)."""
    parts: list[str] = []
    prose: list[str] = []
    fenced = False
    for line in markdown.splitlines(keepends=True):
        if line.lstrip().startswith(("```", "~~~")):
            if not fenced:
                parts.append(LINK.sub(replace, "".join(prose)))
                prose = []
            fenced = not fenced
            parts.append(line)
        elif fenced:
            parts.append(line)
        else:
            prose.append(line)
    parts.append(LINK.sub(replace, "".join(prose)))
    return "".join(parts)
