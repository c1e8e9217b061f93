"""The gateway's words and basic parts: one vocabulary (APIs, reasons, request classes,
lanes), errors in each API's shape, units and the calendar, named tasks, logs, and the one
Redis client.

May import: nothing else of the gateway (and never aiohttp).
"""

from gateway.core.calendar import Calendar, Windows, zone_named
from gateway.core.errors import (
    STOPPING_MESSAGE,
    STOPPING_RETRY_AFTER,
    BackendFailure,
    GatewayError,
    error_body,
    error_headers,
    inband_error,
    retry_after_header,
    shutting_down,
)
from gateway.core.logs import REQUEST_ID, configure_logging, info_writer, printable
from gateway.core.redis_client import connect
from gateway.core.tasks import Background, KeyedTasks, repeat
from gateway.core.units import (
    Duration,
    Size,
    fits_go_duration,
    format_size,
    parse_duration,
    parse_go_duration,
    parse_size,
    whole_seconds,
)
from gateway.core.vocabulary import (
    API_PREFIXES,
    BACKGROUND,
    EMBEDDING_PATHS,
    GENERATION_PATHS,
    REFUSALS,
    Api,
    Lane,
    Reason,
    RequestClass,
    api_of,
)

__all__ = [
    "API_PREFIXES",
    "BACKGROUND",
    "EMBEDDING_PATHS",
    "GENERATION_PATHS",
    "REFUSALS",
    "REQUEST_ID",
    "STOPPING_MESSAGE",
    "STOPPING_RETRY_AFTER",
    "Api",
    "BackendFailure",
    "Background",
    "Calendar",
    "Duration",
    "GatewayError",
    "KeyedTasks",
    "Lane",
    "Reason",
    "RequestClass",
    "Size",
    "Windows",
    "api_of",
    "configure_logging",
    "connect",
    "error_body",
    "error_headers",
    "fits_go_duration",
    "format_size",
    "inband_error",
    "info_writer",
    "parse_duration",
    "parse_go_duration",
    "parse_size",
    "printable",
    "repeat",
    "retry_after_header",
    "shutting_down",
    "whole_seconds",
    "zone_named",
]
