"""structlog, configured once: JSON lines in production, a readable console in a terminal.

Log lines carry what clients sent (a model name, a request id): in the console format,
control characters are shown escaped, so that no client can write terminal escape
sequences (or fake lines) into an admin's terminal. JSON escapes them by itself.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

__all__ = ["configure_logging", "console_rendering", "printable"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def configure_logging(log_format: str = "auto", level: str = "INFO") -> None:
    use_console = log_format == "console" or (log_format == "auto" and sys.stderr.isatty())
    rendering = console_rendering() if use_console else [structlog.processors.JSONRenderer()]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
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


def _for_terminal(
    logger: object, method: str, event: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Escape control characters, and leave out fields that are None (noise on a screen)."""
    return {
        key: printable(value) if isinstance(value, str) and key != "exception" else value
        for key, value in event.items()
        if value is not None
    }
