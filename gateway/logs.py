"""structlog, configured once: JSON lines in production, a readable console in a terminal.

Log lines carry what clients sent (a model name, a request id): in the console format,
control characters are shown escaped, so that no client can write terminal escape
sequences (or fake lines) into an admin's terminal. JSON escapes them by itself.

Every line logged while a request is handled names it (``request_id``): the access log
sets ``REQUEST_ID`` for the request's task (aiohttp runs each request in a task of its
own), and one processor reads it. That is structlog's ``bind_contextvars`` with one
variable: binding and unbinding through structlog cost 1.5 us a request, a tenth of all the
gateway's own bookkeeping, where setting and resetting one ContextVar costs 0.1 us.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from contextvars import ContextVar
from typing import Any

import structlog

__all__ = ["REQUEST_ID", "configure_logging", "console_rendering", "printable"]

REQUEST_ID: ContextVar[str | None] = ContextVar("fairgate_request_id", default=None)
"""The id of the request being handled in this task, if any."""

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def configure_logging(log_format: str = "auto", level: str = "INFO") -> None:
    use_console = log_format == "console" or (log_format == "auto" and sys.stderr.isatty())
    rendering = console_rendering() if use_console else [structlog.processors.JSONRenderer()]
    structlog.configure(
        processors=[
            _add_request_id,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            *rendering,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def console_rendering() -> list[structlog.typing.Processor]:
    """The last steps of a console line: escaped, without Nones, then laid out."""
    return [_for_terminal, structlog.dev.ConsoleRenderer(colors=False, sort_keys=False)]


def printable(text: str) -> str:
    """``text`` with every control character written as an escape (``\\x1b``)."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


def _add_request_id(
    logger: object, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Name the request this line was logged for (after the line's own fields, as
    structlog's merge_contextvars would)."""
    request_id = REQUEST_ID.get()
    if request_id is not None:
        event.setdefault("request_id", request_id)
    return event


def _for_terminal(
    logger: object, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Escape control characters, and leave out fields that are None (noise on a screen)."""
    return {
        key: printable(value) if isinstance(value, str) and key != "exception" else value
        for key, value in event.items()
        if value is not None
    }
