"""structlog, configured once: JSON lines in production, a readable console in a terminal.

Log lines carry what clients sent (a model name, a request id): in the console format,
control characters are shown escaped, so that no client can write terminal escape
sequences (or fake lines) into an admin's terminal. JSON escapes them by itself.

Every line logged while a request is handled names it (``request_id``): the access log
sets ``REQUEST_ID`` for the request's task (aiohttp runs each request in a task of its
own), and one processor reads it. That is structlog's ``bind_contextvars`` with one
variable: binding and unbinding through structlog weighs on every request's bookkeeping,
where setting and resetting one ContextVar is two plain calls.

The access line is written for every request (at INFO, the default), on the path of the
next one: ``info_writer`` runs the configured processors for it directly, without the
bound logger around them, and the JSON renderer's encoder is built once, not per line.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, MutableMapping
from contextvars import ContextVar
from functools import cache
from typing import Any, TextIO, cast

import structlog

__all__ = [
    "REQUEST_ID",
    "Unfailing",
    "configure_logging",
    "console_rendering",
    "info_writer",
    "printable",
]

REQUEST_ID: ContextVar[str | None] = ContextVar("fairgate_request_id", default=None)
"""The id of the request being handled in this task, if any."""


def configure_logging(log_format: str = "auto", level: str = "INFO") -> None:
    use_console = log_format == "console" or (log_format == "auto" and sys.stderr.isatty())
    json_rendering = [structlog.processors.JSONRenderer(serializer=_dumps)]
    rendering = console_rendering() if use_console else json_rendering
    structlog.configure(
        processors=[
            _add_request_id,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            *rendering,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        # A TextIO in all that structlog uses of one (write, flush).
        logger_factory=structlog.PrintLoggerFactory(file=cast(TextIO, Unfailing(sys.stderr))),
        cache_logger_on_first_use=True,
    )


class Unfailing:
    """A log's file whose writes never fail the caller: with the disk full (or stderr
    closed), a line is lost, and the request that logged it is still answered, counted
    and charged. The lines lost are counted, for whoever can read them later."""

    def __init__(self, file: TextIO) -> None:
        self._file = file
        self.lost = 0

    def write(self, text: str) -> int:
        try:
            return self._file.write(text)
        except OSError:
            self.lost += 1
            return 0

    def flush(self) -> None:
        try:
            self._file.flush()
        except OSError:
            self.lost += 1

    def isatty(self) -> bool:
        return self._file.isatty()


def info_writer(logger_name: str) -> Callable[[str, dict[str, Any]], None]:
    """What ``structlog.get_logger(logger_name).info(event, **fields)`` does, the same
    line to the same place, for a line written for every request: the configured
    processors run on ``fields`` (which they may change) without the bound logger's
    layers around them (its keyword arguments, the copy of its context: a third of the
    line's cost). Ask for it after ``configure_logging``; it does not filter by level."""
    config = structlog.get_config()
    processors = config["processors"]
    logger = config["logger_factory"](logger_name)

    def write(event: str, fields: dict[str, Any]) -> None:
        fields["event"] = event
        line: Any = fields
        try:
            for processor in processors:
                line = processor(logger, "info", line)
        except structlog.DropEvent:  # a processor's way to drop it (structlog.testing's)
            return
        # What the last processor returns, taken as structlog takes it.
        if isinstance(line, tuple):
            logger.info(*line[0], **line[1])
        elif isinstance(line, dict):
            logger.info(**line)
        else:
            logger.info(line)

    return write


def _dumps(value: Any, default: Callable[[Any], Any] | None = None, **options: Any) -> str:
    """``json.dumps`` with an encoder made once for each ``default``, where json.dumps
    makes one for every line when it is given one: the same text, without that encoder."""
    if options:
        return json.dumps(value, default=default, **options)
    return _encoder(default).encode(value)


@cache
def _encoder(default: Callable[[Any], Any] | None) -> json.JSONEncoder:
    return json.JSONEncoder(default=default)


def console_rendering() -> list[structlog.typing.Processor]:
    """The last steps of a console line: escaped, without Nones, then laid out."""
    return [_for_terminal, structlog.dev.ConsoleRenderer(colors=False, sort_keys=False)]


def printable(text: str) -> str:
    """``text`` with every character a terminal or a log viewer would act on or hide written
    as an escape (``\\x1b``, ``\\u202e``): controls, and the format characters that reorder
    what is shown (a right-to-left override), which ``str.isprintable`` also refuses."""
    if text.isprintable():  # nearly every value: one scan in C
        return text
    return "".join(char if char.isprintable() else _escape(char) for char in text)


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


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
