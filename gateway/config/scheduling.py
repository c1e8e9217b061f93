"""The policy's say over the order of requests and their wait: ``classes`` (heavy and light),
``costs`` (what the fair scheduler charges) and ``queue`` (the waiting room's bounds).

Apart from ``config/policy.py`` as a concern of its own, like ``intake/lanes.py``; the per-user
side of the
same decisions (``max_queued``, ``weight``) is in ``config/users.py``.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from gateway.config.base import SlotShare, Strict, Weight, slots_on
from gateway.core import Duration

__all__ = ["Classes", "Costs", "HeavyClass", "QueueConfig"]


class QueueConfig(Strict):
    """The gateway's waiting room: short, so that saying no is fast and honest."""

    max_depth: int = Field(default=16, ge=0, description="Requests waiting, all users together.")
    max_wait: Duration = Field(default=30.0, gt=0, description="Longest wait before a 503.")


class HeavyClass(Strict):
    """Long-context requests: they may hold only some of a backend's slots at once."""

    min_prompt_tokens: int = Field(
        default=2048, ge=1, description="An estimated prompt this long (or longer) is heavy."
    )
    min_num_ctx: int | None = Field(
        default=None, ge=1, description="A requested options.num_ctx this large is heavy."
    )
    max_slots: SlotShare = Field(
        default="50%",
        description="Slots of each backend heavy requests may hold: a count, or a share (50%).",
    )
    weight: Weight = Field(default=1.0, description="Share multiplier for heavy requests.")
    wait_for_light: Duration = Field(
        default=2.0,
        ge=0,
        description="How long a heavy request that could start waits for people's light "
        "requests running on its backend to end (background work holds nobody): its prefill "
        "would stall them all (llama.cpp and Ollama batch every slot together). 0: start at "
        "once.",
    )

    def slots_on(self, backend_slots: int) -> int:
        """How many of ``backend_slots`` heavy requests may hold; at least one."""
        return slots_on(self.max_slots, backend_slots)


class LightClass(Strict):
    """Everything that is not heavy: chats, short questions."""

    weight: Weight = Field(default=1.0, description="Share multiplier for light requests.")


class Classes(Strict):
    heavy: HeavyClass = HeavyClass()
    light: LightClass = LightClass()


class Costs(Strict):
    """What a request costs the fair scheduler, in weighted tokens."""

    # A cost of .inf would put its user's every request after everyone's, and two of them
    # (inf - inf) make the order undefined: a cost is a finite number.
    model_config = ConfigDict(allow_inf_nan=False)

    input: float = Field(default=1.0, ge=0, description="Weight of one prompt token.")
    output: float = Field(default=2.0, ge=0, description="Weight of one generated token.")
    image_tokens: int = Field(default=768, ge=0, description="Prompt tokens counted per image.")
    load: float = Field(
        default=50.0,
        ge=0,
        description="A second of model load (or reload, or swap) counts as this many generated "
        "tokens, charged to the request that caused it.",
    )
