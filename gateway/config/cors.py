"""Browser origins as the policy names them (``cors.origins``), for ``edge/http/cors.py`` to match.

A browser's ``Origin`` header is ``scheme://host[:port]``, lower case, without a default port
or a path; an origin written any other way in the policy could never match, so it is either
normalised (case, a default port) or refused with what was probably meant.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field

from gateway.config.base import Strict

__all__ = ["CorsPolicy", "Origin"]


def _origin(text: str) -> str:
    """``scheme://host[:port]`` as a browser sends it in ``Origin``: lower case, no default
    port, no path; anything else could never match, and is an error instead."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("an origin is http:// or https:// and a host, such as https://chat.lan")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("the port must be a number from 0 to 65535") from None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    default = {"http": 80, "https": 443}[parts.scheme]
    origin = f"{parts.scheme}://{host}" + (f":{port}" if port not in (None, default) else "")
    if parts.username or parts.password or parts.path not in ("", "/") or parts.query:
        raise ValueError(f"an origin has no user, path or query; did you mean {origin!r}?")
    return origin


Origin = Annotated[str, AfterValidator(_origin)]


class CorsPolicy(Strict):
    """Browser apps served from other origins that may call the gateway (off when empty)."""

    origins: list[Origin] = Field(
        default_factory=list,
        description="Origins (https://chat.example.com) whose pages may call the gateway; "
        "each one's visitors can use it with whatever key or address they have.",
    )
