"""Where a route's request goes: the ``Target`` of one backend, as every route makes it."""

from __future__ import annotations

from gateway.backends import Backend
from gateway.config import Policy
from gateway.relay import Target
from gateway.wire import TokenEvents

__all__ = ["target_for"]


def target_for(
    backend: Backend,
    policy: Policy,
    path_qs: str,
    *,
    fail_fast: bool = False,
    events: TokenEvents | None = None,
) -> Target:
    """``path_qs`` (the request's path and query) on ``backend``, with the policy's timeouts."""
    return Target(
        backend.url + path_qs,
        policy.timeouts,
        fail_fast=fail_fast,
        close_connection=backend.llama_server,
        keep_origin=not policy.cors.origins,
        events=events,
    )
