"""The network sections of the policy: which host names the gateway answers to
(``hosts:``) and which forwarding header a trusted proxy writes (``proxies.header``).

Checking a request against them is ``gateway.edge.host_names`` and ``gateway.edge.forwarded``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator

__all__ = ["ANY_HOST", "ForwardedHeader", "HostName", "is_host_name"]

ANY_HOST = "*"

ForwardedHeader = Literal["x-forwarded-for", "forwarded"]


def _host_name(text: str) -> str:
    """A name as it is matched (lower case, no trailing dot), or ``*``, or ``*.`` and a
    name; anything else could never match a Host header and is an error instead."""
    name = text.strip().lower()
    if name == ANY_HOST:
        return name
    name = name.removesuffix(".")
    if not is_host_name(name.removeprefix("*.")):
        raise ValueError(
            "a host is a name such as gpu.example.com (or *.example.com, or * for any name): "
            "no scheme, port or path"
        )
    return name


def is_host_name(name: str) -> bool:
    """Dot-separated labels of letters, digits, ``-`` and ``_``, none empty."""
    return all(
        part and part.replace("-", "").replace("_", "").isalnum() and part.isascii()
        for part in name.split(".")
    )


HostName = Annotated[str, AfterValidator(_host_name)]
