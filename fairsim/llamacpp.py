"""llama.cpp's llama-server, in the shapes of real captures (shared/samples/llama-server):
one model, ``-np`` slots, an unbounded FIFO of deferred requests."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import string
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web

from .config import GenJob, GenResult, SimAbort, faults_from
from .engine import Engine
from .llamacpp_messages import count_tokens, messages
from .llamacpp_responses import responses
from .llamacpp_shapes import (
    CHUNK,
    FINGERPRINT,
    METRICS_TYPE,
    Writer,
    dumps,
    error,
    metrics_text,
    model_entry,
    named_slot,
    params,
    props_payload,
    reply,
    slot_view,
    timings,
)
from .ollama_common import cut_connection, message_text, output_budget
from .recording import TapStream
from .wire import rendered, token_id, tokens_in

__all__ = ["LlamaCppAPI"]


class LlamaCppAPI:
    """Handlers for one llama-server serving ``config.models[0]`` (its ``--alias``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.alias = engine.config.models[0] if engine.config.models else "model"

    def add_routes(self, app: web.Application) -> None:
        app.middlewares.append(self.loading_gate)
        for path in ("/health", "/v1/health"):
            app.router.add_get(path, self.health)
        app.router.add_get("/props", self.props)
        app.router.add_get("/slots", self.slots)
        app.router.add_post("/slots/{slot}", self.slot_action)
        app.router.add_get("/metrics", self.metrics)
        for path in ("/models", "/v1/models"):
            app.router.add_get(path, self.models)
        for path in ("/chat/completions", "/v1/chat/completions"):
            app.router.add_post(path, self.chat_completions)
        for path in ("/completion", "/completions"):
            app.router.add_post(path, self.completion)
        app.router.add_post("/v1/messages", functools.partial(messages, self))
        app.router.add_post("/v1/messages/count_tokens", functools.partial(count_tokens, self))
        app.router.add_post("/v1/responses", functools.partial(responses, self))

    def loading(self) -> bool:
        elapsed = self.engine.clock() - self.engine.started_at
        return elapsed < self.engine.config.load_seconds

    @web.middleware
    async def loading_gate(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        if self.loading() and not request.path.startswith("/sim/"):
            return error(503, "Loading model")
        return await handler(request)

    async def health(self, request: web.Request) -> web.Response:
        return reply({"status": "ok"})

    async def props(self, request: web.Request) -> web.Response:
        return reply(props_payload(len(self.engine.slots), self.alias))

    async def slots(self, request: web.Request) -> web.Response:
        if request.query.get("fail_on_no_slot") == "1" and all(s.busy for s in self.engine.slots):
            return error(503, "no slot available")
        return reply([slot_view(slot) for slot in self.engine.slots])

    async def slot_action(self, request: web.Request) -> web.Response:
        """``--slot-save-path``'s save and restore, of the text a slot holds; like the real
        server's, each waits while its slot is processing (``queue_tasks.defer``). Unlike
        it, the slot counts as busy for that moment (the real one blocks its whole loop)."""
        if not self.engine.config.slot_save:
            return error(
                501, "This server does not support slots action. Start it with `--slot-save-path`"
            )
        body = await self.body(request)
        if isinstance(body, web.Response):
            return body
        name, action = body.get("filename"), request.query.get("action")
        if not isinstance(name, str) or not name or "/" in name or ".." in name:
            return error(400, "Invalid filename")
        if action not in ("save", "restore") or not request.match_info["slot"].isdigit():
            return error(400, "Invalid action")
        if action == "restore" and name not in self.engine.saved_slots:
            return error(400, "Unable to restore slot: invalid slot save file")
        wanted = int(request.match_info["slot"])
        if wanted >= len(self.engine.slots):
            return error(400, "Invalid slot ID")
        slot = await self.engine.pool.acquire(wanted=wanted)
        try:
            if action == "save":
                self.engine.saved_slots[name] = slot.cached
            else:
                slot.cached = self.engine.saved_slots[name]
        finally:
            self.engine.pool.release(slot)
        count = len(slot.cached) // 4
        return reply({"id_slot": wanted, "filename": name, f"n_{action}d": count})

    async def metrics(self, request: web.Request) -> web.Response:
        text = metrics_text(self.engine)
        return web.Response(body=text.encode(), headers={"Content-Type": METRICS_TYPE})

    async def models(self, request: web.Request) -> web.Response:
        return reply({"object": "list", "data": [model_entry(self.alias)]})

    async def body(self, request: web.Request) -> dict[str, Any] | web.Response:
        text = (await request.read()).decode(errors="replace")
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return error(
                500,
                f"[json.exception.parse_error.101] parse error at line {exc.lineno}, "
                f"column {exc.colno}: syntax error while parsing value",
            )
        if not isinstance(value, dict):
            return error(400, "request body must be a JSON object")
        return value

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self.body(request)
        if isinstance(body, web.Response):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return error(400, "'messages' is required")
        prompt = "\n".join(message_text(m.get("content")) for m in messages if isinstance(m, dict))
        return await self._run(request, body, prompt, chat=True, tools=body.get("tools"))

    async def completion(self, request: web.Request) -> web.StreamResponse:
        body = await self.body(request)
        if isinstance(body, web.Response):
            return body
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return error(400, '"prompt" must be a string')
        return await self._run(request, body, prompt, chat=False)

    async def _run(
        self,
        request: web.Request,
        body: dict[str, Any],
        prompt: str,
        *,
        chat: bool,
        tools: object = None,
    ) -> web.StreamResponse:
        self.engine.record_prompt(prompt)
        faults = faults_from(body, native=False)
        if faults.status is not None:
            return error(faults.status, "simulated failure")
        limit = next(
            (
                body[k]
                for k in ("max_tokens", "max_completion_tokens", "n_predict")
                if body.get(k) is not None
            ),
            None,
        )
        tokens, limited = output_budget(limit, self.engine.config.default_output_tokens)
        text = rendered(tools, prompt)
        job = GenJob(
            self.alias, tokens_in(text), tokens, limited, None, faults, text=text,
            slot=named_slot(body),
            reuse=body.get("cache_prompt", True) is not False,
        )  # fmt: skip
        stream = body.get("stream") is True
        writer = _Writer(self, request, job, prompt, chat=chat, stream=stream)
        return await self.generated(request, job, writer, stream)

    async def generated(
        self, request: web.Request, job: GenJob, writer: Writer, stream: bool
    ) -> web.StreamResponse:
        """The job run, its tokens to ``writer``, and its reply; or a reply cut as the
        job's faults say."""
        try:
            if stream:  # llama-server's head goes out at once, before a slot or the prefill
                await writer.response.prepare(request)
                result = await self.engine.generate(job, writer.token)
            else:
                result = await _noticed_late(self.engine.generate(job, writer.token))
            return await writer.finish(result)
        except SimAbort:
            await cut_connection(request, writer.response if stream else None)
        except ConnectionError:
            pass  # the client went away; the engine has already freed the slot
        return writer.response


# llama-server's HTTP thread waits for a non-streamed result in polls of this many seconds
# and cancels the task only at a poll that finds the client gone (HTTP_POLLING_SECONDS in
# tools/server/server-context.cpp); a stream is cut at its next write.
DISCONNECT_POLL_SECONDS = 1.0


async def _noticed_late(work: Coroutine[Any, Any, GenResult]) -> GenResult:
    """``work`` (a non-streamed generation), which a client that goes away stops only at
    the next of llama-server's polls: its slot stays busy until then, as the real one's."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    job = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        waited = loop.time() - started
        loop.call_later(DISCONNECT_POLL_SECONDS - waited % DISCONNECT_POLL_SECONDS, job.cancel)
        raise


class _Writer:
    """One reply of /v1/chat/completions or /completion, streamed (SSE) or whole."""

    def __init__(
        self,
        api: LlamaCppAPI,
        request: web.Request,
        job: GenJob,
        prompt: str,
        *,
        chat: bool,
        stream: bool,
    ) -> None:
        self.api, self.request, self.job, self.prompt = api, request, job, prompt
        self.chat, self.stream = chat, stream
        self.response = TapStream(
            "text/event-stream", keep=api.engine.config.record_replies, head_first=True
        )
        alphabet = string.ascii_letters + string.digits
        self.ident = "chatcmpl-" + "".join(random.choices(alphabet, k=32))
        self.created = int(time.time())
        self.parts: list[str] = []

    def head(self, choices: list[dict[str, Any]], kind: str) -> dict[str, Any]:
        return {
            "choices": choices,
            "created": self.created,
            "id": self.ident,
            "model": self.api.alias,
            "system_fingerprint": FINGERPRINT,
            "object": kind,
        }

    async def send(self, value: dict[str, Any] | str) -> None:
        if not self.response.prepared:
            await self.response.prepare(self.request)
        data = value.encode() if isinstance(value, str) else dumps(value)
        await self.response.write(b"data: " + data + b"\n\n")

    async def token(self, text: str) -> None:
        self.parts.append(text)
        if not self.stream:
            return
        if not self.chat:
            n = len(self.parts)
            await self.send(
                {
                    "index": 0,
                    "content": text,
                    "tokens": [token_id(n - 1)],
                    "stop": False,
                    "id_slot": -1,
                    "tokens_predicted": n,
                    "tokens_evaluated": self.job.prompt_tokens,
                }
            )
            return
        if len(self.parts) == 1:
            await self._role_chunk()
        delta = {"content": text}
        await self.send(self.head([{"finish_reason": None, "index": 0, "delta": delta}], CHUNK))

    async def _role_chunk(self) -> None:
        delta = {"role": "assistant", "content": None}
        await self.send(self.head([{"finish_reason": None, "index": 0, "delta": delta}], CHUNK))

    async def finish(self, result: GenResult) -> web.StreamResponse:
        job = self.job
        reason = result.done_reason
        if not self.chat:
            final = {
                "index": 0,
                "content": "" if self.stream else "".join(self.parts),
                "tokens": [],
                "id_slot": result.slot_id,
                "stop": True,
                "model": self.api.alias,
                "tokens_predicted": result.eval_count,
                "tokens_evaluated": job.prompt_tokens,
                "generation_settings": params(
                    job.output_tokens if job.length_limited else -1, self.stream, completion=True
                ),
                "prompt": self.prompt,
                "has_new_line": False,
                "truncated": False,
                "stop_type": "limit" if reason == "length" else "eos",
                "stopping_word": "",
                "tokens_cached": max(0, job.prompt_tokens + result.eval_count - 1),
                "timings": timings(job.prompt_tokens, result),
            }
            if not self.stream:
                return reply(final)
            await self.send(final)
            return self.response
        usage = {
            "completion_tokens": result.eval_count,
            "prompt_tokens": job.prompt_tokens,
            "total_tokens": result.eval_count + job.prompt_tokens,
            "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
        }
        if not self.stream:
            message = {"role": "assistant", "content": "".join(self.parts)}
            whole = self.head([{"finish_reason": reason, "index": 0, "message": message}], "")
            del whole["id"], whole["object"]
            whole.update(object="chat.completion", usage=usage, id=self.ident)
            whole["timings"] = timings(job.prompt_tokens, result)
            return reply(whole)
        if not self.parts:
            await self._role_chunk()
        await self.send(self.head([{"finish_reason": reason, "index": 0, "delta": {}}], CHUNK))
        last = self.head([], CHUNK)
        last.update(usage=usage, timings=timings(job.prompt_tokens, result))
        await self.send(last)
        await self.send("[DONE]")
        return self.response
