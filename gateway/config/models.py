"""The ``models:`` and ``num_ctx:`` sections: the admin's say over the options Ollama fixes
when it loads a model (a request whose ``num_ctx`` differs from the loaded runner's reloads
it for everybody). Applying them to a request is ``gateway.intake.load_options``.
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal, Self

from pydantic import Field, model_validator

from gateway.config.base import Strict

__all__ = ["MIN_NUM_CTX", "ModelPolicy", "NumCtxPolicy"]

MIN_NUM_CTX = 4  # getRunner raises a smaller num_ctx to 4


class NumCtxPolicy(Strict):
    """What Ollama requests may ask of ``options.num_ctx`` (a differing one reloads the
    model for everybody)."""

    min: int | None = Field(default=None, ge=MIN_NUM_CTX, description="Raise smaller to this.")
    max: int | None = Field(default=None, ge=MIN_NUM_CTX, description="Lower larger to this.")
    override: int | Literal["default"] | None = Field(
        default=None,
        description="Replace whatever the client sent (or did not send); 'default' removes "
        "it, so that every request gets the server's context, as OpenAI-API requests do.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        if isinstance(self.override, int) and self.override < MIN_NUM_CTX:
            raise ValueError(f"override must be at least {MIN_NUM_CTX}, or 'default'")
        return self

    @cached_property  # asked by every Ollama request
    def active(self) -> bool:
        return (self.min, self.max, self.override) != (None, None, None)


class ModelPolicy(Strict):
    """Rules for one model's requests."""

    num_ctx: NumCtxPolicy | None = Field(
        default=None, description="Replaces the top-level num_ctx rules for this model."
    )

    @model_validator(mode="after")
    def _some_rule(self) -> Self:
        # {} would read as "this model has rules" and change nothing.
        if self.num_ctx is None:
            raise ValueError("gives no rules: give num_ctx, or remove the entry")
        return self
