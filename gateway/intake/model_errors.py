"""What the gateway answers about a request's model: one it may not use, one no backend
has, a name no backend could have, and no healthy backend to serve it.The request
handler, the reads and the token counting all raise these."""

from __future__ import annotations

from gateway.backends import BackendPool, unavailable
from gateway.core import Api, GatewayError, Reason

__all__ = ["MAX_MODEL_NAME", "checked_name", "model_forbidden", "model_not_found", "no_backend"]


def model_forbidden(user: str, model: str) -> GatewayError:
    return GatewayError(403, Reason.MODEL_FORBIDDEN, f"user {user} may not use model {model!r}")


# Ollama's longest valid name is under 700 characters (a host of 350, a namespace, model and
# tag of 80 each: types/model/name.go). Past this no backend has the model, and a name the
# client sent would be carried whole into the access log, the house page and the errors.
MAX_MODEL_NAME = 1000


def checked_name(model: str) -> str:
    """``model``, or a 400 if no backend can have a model of so long a name."""
    if len(model) > MAX_MODEL_NAME:
        message = f"no model has a name of over {MAX_MODEL_NAME:,} characters"
        raise GatewayError(400, Reason.BAD_REQUEST, message)
    if not model.isascii():
        try:  # JSON may escape half a surrogate pair, which is no text: no model's name
            model.encode()
        except UnicodeEncodeError:
            raise GatewayError(400, Reason.BAD_REQUEST, "a model's name is UTF-8 text") from None
    return model


def model_not_found(model: str) -> GatewayError:
    # Ollama's own wording since v0.5 (server/routes.go).
    return GatewayError(404, Reason.MODEL_NOT_FOUND, f"model '{model}' not found")


# Why no backend of this gateway can serve an API, whatever the wait.
_NOT_SPOKEN = {
    Api.OLLAMA: "no backend of this gateway speaks Ollama's API (its backends are llama.cpp "
    "servers): use the OpenAI-compatible routes under /v1",
    Api.ANTHROPIC: "no backend of this gateway serves Anthropic's Messages API (Ollama and "
    "llama.cpp do; its backends are other OpenAI-compatible servers): use "
    "/v1/chat/completions",
    Api.OPENAI: "no backend of this gateway is configured",
}


def no_backend(pool: BackendPool, api: Api, model: str) -> GatewayError:
    """503 when no healthy backend can answer: it names each backend that could have (for
    ``model``, if one is asked for) and its last error, since at a first run without Ollama
    this answer is what the user reads, and it must say what to check. A retry in 10 s
    gives the probes time to see the backend back; none is offered when no backend speaks
    the API at all."""
    if not any(b.speaks(api) for b in pool.backends):
        # No backend of the kinds that serve the API: no wait will change that.
        return GatewayError(503, Reason.NO_BACKEND, _NOT_SPOKEN[api])
    could = [b for b in pool.backends if b.speaks(api) and (not model or b.serves(model))]
    down = f" ({unavailable(could)})" if could else ""
    wanted = f"serves {model!r}" if model else "can answer this request"
    return GatewayError(
        503, Reason.NO_BACKEND, f"no healthy backend {wanted} right now{down}", retry_after=10.0
    )
