"""Where Anthropic's ``/v1/messages/count_tokens`` is answered: a llama-server that serves
the model. llama-server counts a Messages request's prompt with the model's own tokenizer
and template, and runs no slot for it; Ollama has no such route (server/routes.go serves
``/v1/messages`` alone), so a model only Ollama serves is a 404 that says so, rather than
Ollama's bare 404 page. A read, like ``/api/show``: no turn, under the per-user read cap.

Not free for the engine, though: llama-server renders and tokenizes the whole prompt in its
HTTP threads, on the cores that decode (four clients counting 480 KB prompts in a loop took
another user's token gap from 15 to 129 ms). So each backend counts one prompt at a time,
the others waiting for it a few seconds at most (then 503), each user with one counting and
one waiting at most (then 429), and a user whose budget is spent is refused a count as a
generation would be.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.backends import Backend, BackendPool
from gateway.config import BackendKind
from gateway.core import Api, GatewayError, Reason
from gateway.intake import model_not_found, no_backend

__all__ = ["COUNT_TOKENS", "Counting", "counting_backends"]

COUNT_TOKENS = "/v1/messages/count_tokens"
# A count waits this long for the one under way on its backend: a count of the longest
# prompt takes well under a second on a CPU, so a longer wait is a queue of them.
COUNT_WAIT_SECONDS = 5.0
_PER_USER = 2  # a user's counts under way on one backend: one counting, one waiting


class Counting:
    """One count at a time on each backend, and one of each user's there at a time."""

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}  # by backend: bounded by the policy's
        self._users: dict[tuple[str, str], int] = {}  # (backend, user) -> counts under way

    @asynccontextmanager
    async def turn(self, backend: Backend, user: str) -> AsyncIterator[None]:
        """``backend`` counts for this request alone while in the block; a 503 when the
        count under way there does not end within ``COUNT_WAIT_SECONDS``, a 429 when the
        user has one counting and one waiting there already (so that one user's counts
        cannot hold the others' past their wait)."""
        mine, users = (backend.key, user), self._users
        if users.get(mine, 0) >= _PER_USER:
            raise GatewayError(
                429,
                Reason.TOO_MANY_READS,
                "this user's token counts are already under way here, one counting and one "
                "waiting; send the next when one ends",
                retry_after=1.0,
            )
        users[mine] = users.get(mine, 0) + 1
        try:
            async with self._one_at_a_time(backend):
                yield
        finally:
            if users[mine] > 1:
                users[mine] -= 1
            else:
                del users[mine]

    @asynccontextmanager
    async def _one_at_a_time(self, backend: Backend) -> AsyncIterator[None]:
        lock = self._locks.setdefault(backend.key, asyncio.Lock())
        try:
            async with asyncio.timeout(COUNT_WAIT_SECONDS):
                await lock.acquire()
        except TimeoutError:
            raise GatewayError(
                503,
                Reason.GATEWAY_BUSY,
                "other token counts are under way on the backend serving this model; "
                "retry in a moment",
                retry_after=1.0,
            ) from None
        try:
            yield
        finally:
            lock.release()


def counting_backends(pool: BackendPool, model: str) -> tuple[Backend, ...]:
    """The healthy llama-servers that can count ``model``'s tokens, or GatewayError: the
    model unknown (404), its llama-servers down (503), or served by Ollama alone (404)."""
    if not model:
        raise GatewayError(400, Reason.BAD_REQUEST, "model is required")
    counting = tuple(b for b in pool.serving(Api.ANTHROPIC, model) if b.kind == "llamacpp")
    if counting:
        return counting
    if pool.known_nowhere(Api.ANTHROPIC, model):
        raise model_not_found(model)
    if any(b.kind == "llamacpp" and b.serves(model) for b in pool.backends):
        raise no_backend(pool, Api.ANTHROPIC, model)
    kinds = sorted({b.kind for b in pool.serving(Api.ANTHROPIC, model)}) or ["ollama"]
    served = " and ".join(_NOT_COUNTING.get(kind, kind) for kind in kinds)
    raise GatewayError(
        404,
        Reason.NOT_FOUND,
        f"{COUNT_TOKENS} is answered by llama.cpp servers only, and {model!r} is served by "
        f"{served}; the usage of a /v1/messages reply gives the count",
    )


# Why a backend of each kind does not count a prompt's tokens here, as a 404 says it.
_NOT_COUNTING: dict[BackendKind, str] = {
    "ollama": "Ollama, which has no such route",
    "llamacpp-router": "llama-server's router, which would load the model for a count",
}
