"""The log lines: the access line's short way writes what structlog's logger would."""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from gateway.core.logs import REQUEST_ID, configure_logging, info_writer, printable

# A line's timestamp, the one part that differs between two lines written one after another.
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


@pytest.fixture(autouse=True)
def _defaults_after() -> Iterator[None]:
    """structlog's defaults back after each test: its configuration is the process's."""
    try:
        yield
    finally:
        structlog.reset_defaults()


def _configured(log_format: str, monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """Logging configured as the gateway does it, into the returned stream (set in the
    test's own call: pytest puts its capture back on sys.stderr between a fixture and the
    test)."""
    captured = io.StringIO()
    monkeypatch.setattr(sys, "stderr", captured)
    configure_logging(log_format, "INFO")
    return captured


def _fields() -> dict[str, Any]:
    """An access line's kinds of values: text with control characters, numbers, None."""
    return {
        "request_id": "0123456789abcdef",
        "client": "127.0.0.1",
        "model": "llama3.2:3b\x1b[31m\u009b",
        "status": 200,
        "queue_wait_s": 0.0012,
        "reason": None,
        "client_gone": False,
    }


@pytest.mark.parametrize("log_format", ["json", "console"])
def test_info_writer_writes_what_the_logger_writes(
    log_format: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The access line's writer and ``log.info`` write the same text, the time aside, in
    both formats, the request's id included."""
    stderr = _configured(log_format, monkeypatch)
    named = REQUEST_ID.set("an-outer-id")
    try:
        structlog.get_logger("fairgate.test").info("request", **_fields())
        info_writer("fairgate.test")("request", _fields())
    finally:
        REQUEST_ID.reset(named)
    by_logger, by_writer = stderr.getvalue().splitlines()
    assert _TIMESTAMP.search(by_writer) is not None
    assert _TIMESTAMP.sub("T", by_writer) == _TIMESTAMP.sub("T", by_logger)
    assert "\x1b" not in by_writer and "\u009b" not in by_writer


def test_info_writer_names_the_request_being_handled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line written without an id of its own names the request it is written in."""
    stderr = _configured("json", monkeypatch)
    named = REQUEST_ID.set("abc123")
    try:
        info_writer("fairgate.test")("request", {"status": 200})
    finally:
        REQUEST_ID.reset(named)
    assert '"request_id": "abc123"' in stderr.getvalue()


def test_characters_that_reorder_or_hide_text_are_written_as_escapes() -> None:
    """A right-to-left override, a zero-width space and a line separator would make a
    terminal show other text than was sent: each is written as its escape; plain text,
    accents and spaces stay as they are."""
    assert printable("llama\u202e3\u200b\u2028x") == "llama\\u202e3\\u200b\\u2028x"
    assert printable("Jos\u00e9's llama3.2:3b") == "Jos\u00e9's llama3.2:3b"
    assert printable("\x1b[2J\U000e0041") == "\\x1b[2J\\U000e0041"
