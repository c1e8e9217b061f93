"""Where Anthropic's ``/v1/messages/count_tokens`` is answered: a llama-server that serves
the model. llama-server counts a Messages request's prompt with the model's own tokenizer
and template, and runs no slot for it; Ollama has no such route (server/routes.go serves
``/v1/messages`` alone), so a model only Ollama serves is a 404 that says so, rather than
Ollama's bare 404 page. A read, like ``/api/show``: no turn, under the per-user read cap.
"""

from __future__ import annotations

from gateway.backends import Backend, BackendPool
from gateway.core import Api, GatewayError, Reason
from gateway.intake import model_not_found, no_backend

__all__ = ["COUNT_TOKENS", "counting_backends"]

COUNT_TOKENS = "/v1/messages/count_tokens"


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
    raise GatewayError(
        404,
        Reason.NOT_FOUND,
        f"{COUNT_TOKENS} is answered by llama.cpp servers only, and {model!r} is served by "
        "Ollama, which has no such route; the usage of a /v1/messages reply gives the count",
    )
