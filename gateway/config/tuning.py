"""The policy's tuning sections: ``timeouts``, ``monitoring``, ``keep_alive``, ``warmth`` and
``redis``.

Each is a handful of numbers whose defaults suit a household, read by one part of the gateway
(the relay and pump, the backend monitor, the warmth keeper, admission). Apart from
``config/policy.py`` so that a part can take its own section without importing the whole policy.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.config.base import Strict
from gateway.core import Duration

__all__ = ["KeepAlivePolicy", "Monitoring", "RedisPolicy", "Timeouts", "Warmth"]


class Timeouts(Strict):
    """How long the gateway waits on a backend, or on a client, before giving up on it."""

    connect: Duration = Field(default=5.0, gt=0, description="To open a connection.")
    first_byte: Duration = Field(
        default=300.0, gt=0, description="From sending to the first byte (covers model load)."
    )
    idle: Duration = Field(default=120.0, gt=0, description="Longest gap between two chunks.")
    client_stall: Duration = Field(
        default=30.0,
        gt=0,
        description="Longest a client may leave the reply unread before its stream is ended "
        "and its slot freed.",
    )


class Monitoring(Strict):
    """How the gateway watches its backends, in the background."""

    interval: Duration = Field(default=5.0, gt=0, description="Between two probes of a backend.")
    timeout: Duration = Field(default=3.0, gt=0, description="For one probe request.")
    unhealthy_after: int = Field(
        default=2, ge=1, description="Failed probes in a row before a backend leaves rotation."
    )
    healthy_after: int = Field(
        default=2, ge=1, description="Good probes in a row before it comes back."
    )


class KeepAlivePolicy(Strict):
    """What proxied requests may ask of Ollama's keep_alive (a client's 0 unloads the model
    for everybody)."""

    min: Duration | None = Field(default=None, description="Raise shorter keep_alive to this.")
    max: Duration | None = Field(
        default=None, description="Lower longer (or forever, negative) keep_alive to this."
    )
    override: Duration | None = Field(
        default=None, description="Replace whatever the client sent (or did not send)."
    )


class Warmth(Strict):
    """Keeping models loaded, and noticing when a request paid for a load."""

    interval: Duration = Field(default=60.0, gt=0, description="Between two keep-warm checks.")
    cold_start_after: Duration = Field(
        default=1.0, ge=0, description="A reply whose load_duration exceeds this was a cold start."
    )


class RedisPolicy(Strict):
    """What to do when the shared state (FAIRGATE_REDIS_URL) cannot be reached."""

    on_failure: Literal["local", "closed"] = Field(
        default="local",
        description="local: go on with per-replica limits (flagged in /status); closed: 503.",
    )
