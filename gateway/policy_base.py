"""The building blocks of the policy's models: a strict base and a share of a backend's slots.

Apart from ``policy.py`` so that a concern with its own section of the file (``lanes.py``)
can declare its models beside its logic without importing the whole policy.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict

__all__ = ["SlotShare", "Strict", "model_key", "slots_on"]


class Strict(BaseModel):
    """Unknown fields are errors (a typo must not be ignored); a loaded policy is frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _count_or_share(value: object) -> object:
    # Before the int | str union, so that a wrong value gets this one message, not one per
    # member of the union.
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    if isinstance(value, str) and re.fullmatch(r"\d{1,3}%", value) and 0 < int(value[:-1]) <= 100:
        return value
    raise ValueError("must be a count of slots such as 2, or a share such as 50%")


SlotShare = Annotated[int | str, BeforeValidator(_count_or_share)]
"""Some of a backend's slots: a count (``2``) or a share (``50%``)."""


def slots_on(share: int | str, backend_slots: int) -> int:
    """How many of ``backend_slots`` ``share`` allows; at least one."""
    if isinstance(share, int):
        return min(share, backend_slots)
    return max(1, backend_slots * int(share[:-1]) // 100)


def model_key(name: str) -> str:
    """Ollama treats ``llama3.2`` and ``llama3.2:latest`` as one model."""
    return name if ":" in name else f"{name}:latest"
