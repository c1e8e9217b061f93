"""The building blocks of the policy's models: a strict base and a share of a backend's slots.

Apart from ``config/policy.py`` so that a concern with its own section of the file
(``intake/lanes.py``)
can declare its models beside its logic without importing the whole policy.
"""

from __future__ import annotations

import re
import types
from functools import cache, lru_cache
from ipaddress import IPv4Network, IPv6Network
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from gateway.config.problems import yes_no_for_a_number

__all__ = [
    "AddressRange",
    "HeaderName",
    "SlotShare",
    "Strict",
    "Weight",
    "model_key",
    "slots_on",
]


class Strict(BaseModel):
    """Unknown fields are errors (a typo must not be ignored); a loaded policy is frozen; a
    yes/no is not a number."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_yes_no_for_a_number(cls, data: Any) -> Any:
        # YAML reads off, no, yes and on as booleans, and pydantic's lax mode takes a boolean
        # for 0 or 1: "max_queued: off" let nobody queue, "weight: yes" gave 1. Every
        # section's numbers pass here, whatever their type (a count, a Duration, a Size, a
        # SlotShare), so that no new field can forget it.
        if isinstance(data, dict):
            for name in _number_fields(cls):
                value = data.get(name)
                if isinstance(value, bool):
                    raise yes_no_for_a_number((name,), value)
        return data


@cache
def _number_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of ``model`` that take a number and not a yes/no."""
    return tuple(
        name
        for name, field in model.model_fields.items()
        if (kinds := _kinds(field.annotation)) & {int, float} and bool not in kinds
    )


def _kinds(annotation: Any) -> set[Any]:
    """The types ``annotation`` admits, through Annotated, Optional and unions."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _kinds(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return set().union(*map(_kinds, get_args(annotation)))
    return {annotation}


def _count_or_share(value: object) -> object:
    # Before the int | str union, so that a wrong value gets this one message, not one per
    # member of the union.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str) and re.fullmatch(r"\d{1,3}%", value) and 0 < int(value[:-1]) <= 100:
        return value
    raise ValueError("must be a count of slots such as 2, or a share such as 50%")


def _range_in_text(value: object) -> object:
    # ipaddress takes a number for an address (10 is 0.0.0.10/32, YAML's off is 0.0.0.0/32):
    # a client or proxy given so would match nobody, without a word.
    if isinstance(value, str | IPv4Network | IPv6Network):
        return value
    raise ValueError("write an address or CIDR range, such as 192.168.1.50 or 192.168.1.0/24")


AddressRange = Annotated[IPv4Network | IPv6Network, BeforeValidator(_range_in_text)]
"""An address or CIDR range, written as text (``192.168.1.0/24``)."""

_FIELD_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110's token
_CARRY_KEYS = frozenset({"authorization", "proxy-authorization", "x-api-key", "cookie"})


def _header_name(name: str) -> str:
    # A name no request can carry ("X Task", "X-Task:") would match nothing. One that
    # carries the key is on every request with a key: every one would be background, or
    # a front end's person would be named by its key (in /status, the logs, usage).
    if not _FIELD_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a header name: letters, digits and -, no space or :")
    if name.lower() in _CARRY_KEYS:
        raise ValueError(f"{name!r} carries the key: name a header of its own")
    return name


HeaderName = Annotated[str, AfterValidator(_header_name)]
"""A request header the admin names, for the gateway to read."""

SlotShare = Annotated[int | str, BeforeValidator(_count_or_share)]
"""Some of a backend's slots: a count (``2``) or a share (``50%``)."""

Weight = Annotated[float, Field(ge=0.001, le=1000)]
"""A share multiplier: from a thousandth to a thousand times the default's. The fair
scheduler divides by a user's and a class's weights multiplied; two that were only above 0
(1e-200 each) made 0 and every request of that user a 500, and infinity charged nothing."""


def slots_on(share: int | str, backend_slots: int) -> int:
    """How many of ``backend_slots`` ``share`` allows; at least one."""
    if isinstance(share, int):
        return min(share, backend_slots)
    return max(1, backend_slots * int(share[:-1]) // 100)


_HOST, _NAMESPACE, _TAG = "registry.ollama.ai", "library", "latest"  # Ollama's defaults


def model_key(name: str) -> str:
    """``_key(name)``: remembered for short names (each request asks a dozen times, for the
    same few models), worked out again for long ones, so that clients' names cannot fill
    memory."""
    return _remembered_key(name) if len(name) <= _REMEMBERED_NAME else _key(name)


_REMEMBERED_NAME = 128  # characters: any real model's name


@lru_cache(maxsize=1024)
def _remembered_key(name: str) -> str:
    return _key(name)


def _key(name: str) -> str:
    """The model ``name`` names, as Ollama tells models apart: one key for ``llama3.2``,
    ``llama3.2:latest``, ``library/llama3.2`` and ``registry.ollama.ai/library/LLAMA3.2``.

    Ollama parses a name into host, namespace, model and tag, fills in the missing ones
    (types/model/name.go: ParseName), and finds the model on its disk matching each part
    case-insensitively (server/routes.go: getExistingName, on every generation route).
    Every lookup by model goes through this key, so that no spelling Ollama runs as a
    model escapes the rules written for it. The key is the name as /api/tags lists it
    (DisplayShortest), in lower case. A name Ollama would refuse as invalid may share a
    key with a valid one: the rules of that one apply, and Ollama runs nothing."""
    host, namespace, model, tag = _ollama_parts(name)
    host, namespace = (host or _HOST).lower(), (namespace or _NAMESPACE).lower()
    if host != _HOST:
        prefix = f"{host}/{namespace}/"
    else:
        prefix = "" if namespace == _NAMESPACE else f"{namespace}/"
    return f"{prefix}{model}:{tag or _TAG}".lower()


def _ollama_parts(name: str) -> tuple[str, str, str, str]:
    """Host, namespace, model and tag of ``name``, each empty where it names none; as
    Ollama's ParseNameBare splits them."""
    rest, tag = name, ""
    if name.rfind(":") > name.rfind("/"):  # no tag holds a "/"; a host may hold a ":"
        rest, _, tag = name.rpartition(":")
    if "/" not in rest:
        return "", "", rest, tag
    rest, _, model = rest.rpartition("/")
    if "/" not in rest:
        return "", rest, model, tag
    rest, _, namespace = rest.rpartition("/")
    scheme, separator, host = rest.partition("://")
    return host if separator else scheme, namespace, model, tag
