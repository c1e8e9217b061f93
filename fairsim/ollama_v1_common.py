"""What the /v1 routes of Ollama's OpenAI-compatible middleware share: errors in OpenAI's
shape, request bodies read as gin binds them, a request's generation built and run
(streamed or whole), and replies as Go's json.Encoder writes them. The OpenAI routes
(``ollama_v1``), Anthropic's /v1/messages (``ollama_anthropic``) and the Responses API
(``ollama_responses``) all lean on it, so it sits below each of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from aiohttp import web

from .config import GenJob, GenResult, QueueFull, SimAbort, faults_from
from .engine import Emit, Engine
from .ollama import OllamaAPI
from .ollama_common import (
    JSON_UTF8,
    MAX_QUEUE_MESSAGE,
    RequestError,
    cut_connection,
    output_budget,
    read_body,
)
from .recording import TapStream
from .wire import go_json, tokens_in

__all__ = [
    "EventStream",
    "encoded",
    "generated",
    "job_for",
    "openai_error",
    "read_v1_body",
    "streamed_or_whole",
]

_ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error"}


def openai_error(error: RequestError, *, from_middleware: bool = False) -> web.Response:
    """OpenAI's error shape. Ollama's middleware rejects bad requests through gin's c.JSON
    (charset, no newline); errors from the handlers pass through its writer (newline)."""
    body = {
        "error": {
            "message": error.message,
            "type": _ERROR_TYPES.get(error.status, "api_error"),
            "param": None,
            "code": None,
        }
    }
    if from_middleware:
        return web.Response(
            status=error.status, body=go_json(body), headers={"Content-Type": JSON_UTF8}
        )
    return encoded(body, error.status)


async def read_v1_body(request: web.Request, go_struct: str) -> dict[str, Any]:
    """Like read_body, but worded as gin's binding says it: an empty body is just "EOF"."""
    try:
        return await read_body(request, go_struct)
    except RequestError as exc:
        if exc.message == "missing request body":
            exc.message = "EOF"
        raise


def job_for(
    native: OllamaAPI,
    body: dict[str, Any],
    prompt: str,
    limit: Any,
    refused: Callable[[RequestError], web.Response],
) -> GenJob | web.Response:
    """The generation a request asks for (its model, prompt, output ``limit`` and the
    simulator's faults), or the reply that refuses it in the route's shape."""
    name = str(body.get("model") or "")
    faults = faults_from(body, native=False)
    if faults.status is not None:
        return refused(RequestError(faults.status, "simulated failure"))
    model = native.resolve(name)
    if model is None:
        return refused(RequestError(404, f"model '{name}' not found"))
    tokens, limited = output_budget(limit, native.engine.config.default_output_tokens)
    return GenJob(model, tokens_in(prompt), tokens, limited, None, faults)


async def generated(
    engine: Engine,
    request: web.Request,
    job: GenJob,
    stream: TapStream,
    emit: Emit | None,
    parts: list[str],
    refused: Callable[[RequestError], web.Response],
) -> GenResult | web.StreamResponse:
    """The job run, its tokens to ``emit`` (a stream's, writing to ``stream``) or, for a
    whole reply (None), collected into ``parts``; or the reply that ends the request: the
    queue full (503, ``refused`` in the route's shape), or cut as the job's faults say."""

    async def collect(text: str) -> None:
        parts.append(text)

    try:
        return await engine.generate(job, emit or collect)
    except QueueFull:
        return refused(RequestError(503, MAX_QUEUE_MESSAGE))
    except SimAbort:
        await cut_connection(request, stream if emit is not None else None)
        return stream
    except ConnectionError:
        return stream


class EventStream(Protocol):
    """A reply told as named events (Anthropic's, the Responses API's)."""

    response: TapStream

    async def token(self, text: str) -> None: ...

    async def finish(self, result: GenResult, prompt_tokens: int) -> None: ...


async def streamed_or_whole(
    engine: Engine,
    request: web.Request,
    job: GenJob,
    stream: EventStream,
    streaming: bool,
    refused: Callable[[RequestError], web.Response],
) -> tuple[GenResult, str] | web.StreamResponse:
    """``job`` run: streamed, its tokens as ``stream``'s events, then its end (the reply is
    returned); or whole, its result and text returned for the route to shape. Or the reply
    that ended it (``generated``)."""
    parts: list[str] = []
    emit = stream.token if streaming else None
    result = await generated(engine, request, job, stream.response, emit, parts, refused)
    if not isinstance(result, GenResult):
        return result  # refused, or cut
    if streaming:
        await stream.finish(result, job.prompt_tokens)
        return stream.response
    return result, "".join(parts)


def encoded(value: Any, status: int = 200) -> web.Response:
    """What Go's json.Encoder writes: compact JSON and a newline."""
    return web.Response(
        status=status, body=go_json(value) + b"\n", headers={"Content-Type": "application/json"}
    )
