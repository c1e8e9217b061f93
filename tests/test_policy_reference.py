"""docs/policy.md is the policy's reference as its own definitions write it: it cannot drift."""

from __future__ import annotations

from pathlib import Path

from gateway.config.policy import Policy
from gateway.config.reference import policy_reference

DOCS = Path(__file__).resolve().parents[1] / "docs" / "policy.md"


def test_the_reference_is_what_the_definitions_write() -> None:
    assert DOCS.read_text() == policy_reference(), "run `make docs` and commit docs/policy.md"


def test_every_field_of_every_section_is_in_it() -> None:
    """Each field of the top level and of a few nested sections, by its YAML name."""
    text = policy_reference()
    for name in Policy.model_fields:
        assert f"| `{name}` |" in text
    for nested in ("min_prompt_tokens", "beside_people", "on_behalf", "max_restarts"):
        assert f"| `{nested}` |" in text
    for path in ("`classes.heavy`", "`users.NAME`", "`lanes.background`", "`backends[]`"):
        assert f"## {path}" in text


def test_its_links_lead_somewhere() -> None:
    """Every in-page link names an anchor the page has."""
    text = policy_reference()
    anchors = set(_between(text, '<a id="', '"></a>'))
    targets = set(_between(text, "](#", ")"))
    assert targets and targets <= anchors


def _between(text: str, start: str, end: str) -> list[str]:
    found = []
    at = text.find(start)
    while at >= 0:
        close = text.find(end, at + len(start))
        found.append(text[at + len(start) : close])
        at = text.find(start, close)
    return found
