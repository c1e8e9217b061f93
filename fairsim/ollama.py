"""Ollama's native API (/api/*), byte for byte as Ollama's server/routes.go writes it."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .catalog import MODIFIED_AT_NS, details, model_digest, model_spec, show_payload
from .config import GenJob, GenResult, LoadOptions, QueueFull, SimAbort, faults_from
from .engine import Engine
from .ollama_common import (
    MAX_QUEUE_MESSAGE,
    NDJSON,
    RequestError,
    cut_connection,
    embed_text,
    error_response,
    json_response,
    keep_alive_of,
    load_options_of,
    message_text,
    now_utc,
    output_budget,
    read_body,
)
from .ollama_origins import allow_origin, check_origin
from .recording import TapStream
from .wire import float32_widened, go_expiry, go_json, go_time, rendered, tokens_in

__all__ = ["OllamaAPI"]


class OllamaAPI:
    """Handlers for /api/* on one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def resolve(self, name: str, any_case: bool = True) -> str | None:
        """The configured model ``name`` refers to, as Ollama finds one on its disk: the
        name's missing host, namespace and tag filled in (types/model/name.go ParseName),
        each part matched case-insensitively (server/routes.go getExistingName, on every
        route but the legacy /api/embeddings, which reads the manifest at the path the
        name spells: ``any_case`` False)."""
        wanted = _name_parts(name, any_case)
        if wanted is None:
            return None
        for model in self.engine.config.models:
            if _name_parts(model, any_case) == wanted:
                return model
        return None

    def add_routes(self, app: web.Application) -> None:
        app.middlewares.append(check_origin)
        app.on_response_prepare.append(allow_origin)
        app.router.add_get("/", self.root)
        app.router.add_get("/api/version", self.version)
        app.router.add_get("/api/tags", self.tags)
        app.router.add_get("/api/ps", self.ps)
        app.router.add_post("/api/show", self.guarded(self.show))
        app.router.add_post("/api/chat", self.guarded(self.chat))
        app.router.add_post("/api/generate", self.guarded(self.generate))
        app.router.add_post("/api/embed", self.guarded(self.embed))
        app.router.add_post("/api/embeddings", self.guarded(self.embeddings))

    @staticmethod
    def guarded(
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def run(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request)
            except RequestError as exc:
                return error_response(exc)
            except QueueFull:
                return error_response(RequestError(503, MAX_QUEUE_MESSAGE))

        return run

    async def root(self, request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running", content_type="text/plain", charset="utf-8")

    async def version(self, request: web.Request) -> web.Response:
        return json_response({"version": self.engine.config.ollama_version})

    async def tags(self, request: web.Request) -> web.Response:
        models = [
            {
                "name": name,
                "model": name,
                "modified_at": go_time(MODIFIED_AT_NS, utc=False),
                "size": model_spec(name).size,
                "digest": model_digest(name),
                "details": details(name),
            }
            for name in self.engine.config.models
        ]
        return json_response({"models": models})

    async def ps(self, request: web.Request) -> web.Response:
        """Each runner: its size (weights and KV cache, all in VRAM here), its num_ctx per
        slot, and when it unloads; the longest-lived first (routes.go PsHandler)."""
        now = self.engine.clock()
        expiring = self.engine.loaded_models()
        runners = sorted(
            self.engine.scheduler.loaded.values(), key=lambda runner: -expiring[runner.model]
        )
        models = [
            {
                "name": runner.model,
                "model": runner.model,
                "size": runner.size,
                "digest": model_digest(runner.model),
                "details": details(runner.model),
                "expires_at": go_expiry(expiring[runner.model], now),
                "size_vram": runner.size,
                "context_length": runner.options.num_ctx,
            }
            for runner in runners
        ]
        return json_response({"models": models})

    async def show(self, request: web.Request) -> web.Response:
        body = await read_body(request, "api.ShowRequest")
        name = str(body.get("model") or body.get("name") or "")
        if not name:
            raise RequestError(400, "model is required")
        model = self.resolve(name)
        if model is None:
            raise RequestError(404, f"model '{name}' not found")
        return json_response(show_payload(model))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, chat=True)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, chat=False)

    async def _generation(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        go_struct = "api.ChatRequest" if chat else "api.GenerateRequest"
        body = await read_body(request, go_struct)
        name = body.get("model") or ""
        stream = body.get("stream")
        options = body.get("options") or {}
        keep_alive = keep_alive_of(body)
        if chat:
            messages = body.get("messages") or []
            texts = [message_text(m.get("content")) for m in messages if isinstance(m, dict)]
            prompt = "\n".join(texts)
            counted = rendered(body.get("tools"), prompt)
            empty = not messages
        else:
            prompt = body.get("prompt") or ""
            counted = (body.get("system") or "") + prompt
            empty = not prompt
        if not empty:
            self.engine.record_prompt(prompt)
        faults = faults_from(body, native=True)
        if faults.status is not None:
            raise RequestError(faults.status, "simulated failure")
        if not name and chat:
            raise RequestError(400, "model is required")
        model = self.resolve(name)
        if model is None:
            raise RequestError(404, f"model '{name}' not found")

        head: dict[str, Any] = {"model": name, "created_at": ""}
        unload = empty and keep_alive == 0
        load = LoadOptions() if unload else load_options_of(options)
        if empty:
            reason = "unload" if unload else "load"
            if unload:
                self.engine.unload(model)
            else:
                await self.engine.touch(model, load, keep_alive)
            reply = dict(head, created_at=now_utc())
            reply.update(
                {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
            )
            return json_response(dict(reply, done=True, done_reason=reason))

        tokens, limited = output_budget(
            options.get("num_predict"), self.engine.config.default_output_tokens
        )
        job = GenJob(
            model, tokens_in(counted), tokens, limited, keep_alive, faults, load, text=counted
        )

        def chunk(text: str) -> dict[str, Any]:
            piece = (
                {"message": {"role": "assistant", "content": text}} if chat else {"response": text}
            )
            return dict(head, created_at=now_utc(), **piece, done=False)

        def final(text: str, result: GenResult) -> dict[str, Any]:
            reply = chunk(text)
            reply.update(done=True, done_reason=result.done_reason)
            if not chat:
                reply["context"] = list(range(1, job.prompt_tokens + result.eval_count + 1))
            reply.update(
                total_duration=result.total_ns,
                load_duration=result.load_ns,
                # The whole prompt, cached or not; 0.32 does not say what its cache read
                # (prompt_eval_cached_count came with ollama/ollama#17943, later).
                prompt_eval_count=job.prompt_tokens,
                prompt_eval_duration=result.prompt_ns,
                eval_count=result.eval_count,
                eval_duration=result.eval_ns,
            )
            return reply

        if stream is False:
            parts: list[str] = []

            async def collect(text: str) -> None:
                parts.append(text)

            result = await self.engine.generate(job, collect)
            return json_response(final("".join(parts), result))

        response = TapStream(NDJSON, keep=self.engine.config.record_replies)

        async def send(value: dict[str, Any]) -> None:
            if not response.prepared:
                await response.prepare(request)
            await response.write(go_json(value) + b"\n")

        async def emit(text: str) -> None:
            await send(chunk(text))

        try:
            result = await self.engine.generate(job, emit)
            await send(final("", result))
        except SimAbort:
            await cut_connection(request, response)
        except ConnectionError:
            pass  # the client went away; the engine has already freed the slot
        return response

    async def embed(self, request: web.Request) -> web.Response:
        body = await read_body(request, "api.EmbedRequest")
        name = body.get("model") or ""
        keep_alive = keep_alive_of(body)
        raw_input = body.get("input")
        if isinstance(raw_input, str):
            inputs = [raw_input] if raw_input else []
        elif isinstance(raw_input, list) and all(isinstance(i, str) for i in raw_input):
            inputs = list(raw_input)
        elif raw_input is None:
            inputs = []
        else:
            raise RequestError(400, "invalid input type")
        model = self._embedding_model(name, body)
        load = load_options_of(body.get("options"))
        if not inputs:
            await self.engine.touch(model, load, keep_alive)
            return json_response({"model": name, "embeddings": []})
        tokens = sum(tokens_in(text) for text in inputs)
        total_ns, load_ns = await self.engine.embed(model, tokens, keep_alive, load)
        dims = body.get("dimensions")
        vectors = [embed_text(text, self.engine.config.embedding_dims, dims) for text in inputs]
        return json_response(
            {
                "model": name,
                "embeddings": vectors,
                "total_duration": total_ns,
                "load_duration": load_ns,
                "prompt_eval_count": tokens,
            }
        )

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await read_body(request, "api.EmbeddingRequest")
        name = body.get("model") or ""
        prompt = body.get("prompt") or ""
        keep_alive = keep_alive_of(body)
        # The legacy route skips getExistingName: the manifest is read as the name spells it.
        model = self._embedding_model(name, body, any_case=False)
        load = load_options_of(body.get("options"))
        if not prompt:
            await self.engine.touch(model, load, keep_alive)
            return json_response({"embedding": []})
        await self.engine.embed(model, tokens_in(prompt), keep_alive, load)
        vector = embed_text(prompt, self.engine.config.embedding_dims, None)
        return json_response({"embedding": [float32_widened(v) for v in vector]})

    def _embedding_model(self, name: str, body: dict[str, Any], any_case: bool = True) -> str:
        faults = faults_from(body, native=True)
        if faults.status is not None:
            raise RequestError(faults.status, "simulated failure")
        model = self.resolve(name, any_case) if name else None
        if model is None:
            # The embed handlers report a missing model through handleScheduleError.
            raise RequestError(404, f"model {json.dumps(name)} not found, try pulling it first")
        return model


# [[scheme://]host/][namespace/]model[:tag]: a tag is what follows the last ":" after the
# last "/" (a host may hold a port).
_NAME = re.compile(
    r"(?:(?:(?:\w+://)?(?P<host>[^/]+)/)?(?P<namespace>[^/]+)/)?(?P<model>[^/]+?)(?::(?P<tag>[^:/]+))?"
)


def _name_parts(name: str, any_case: bool) -> tuple[str, ...] | None:
    """Host, namespace, model and tag, Ollama's defaults filled in (in lower case when
    ``any_case``)."""
    found = _NAME.fullmatch(name)
    if found is None or not found["model"]:
        return None
    host, namespace = found["host"] or "registry.ollama.ai", found["namespace"] or "library"
    parts = (host, namespace, found["model"], found["tag"] or "latest")
    return tuple(part.lower() for part in parts) if any_case else parts
