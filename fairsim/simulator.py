"""The Simulator: one engine, served as an aiohttp application of the chosen flavour."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable

from aiohttp import web
from multidict import CIMultiDict

from .config import SimConfig, SimStats
from .engine import Engine
from .llamacpp import LlamaCppAPI
from .ollama import OllamaAPI
from .ollama_anthropic import messages
from .ollama_responses import responses
from .ollama_v1 import OpenAICompatAPI
from .recording import Recorder

__all__ = ["Simulator", "run_sim"]


class Simulator:
    """A simulated Ollama (or llama-server) whose counters tests can wait on.

    Serve ``make_app()`` with ``web.AppRunner(app, handler_cancellation=True)``: aiohttp only
    cancels a handler whose client went away when that flag is on, and that cancellation is
    how a queued or stalled request notices the disconnect and frees its slot.
    """

    def __init__(self, config: SimConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.engine = Engine(config, clock)
        self._recorder = Recorder(config.record_replies)

    @property
    def replies(self) -> list[bytes]:
        """With record_replies: the body of every reply, in order (streams whole)."""
        return self._recorder.replies

    @property
    def reply_types(self) -> list[str]:
        """With record_replies: the Content-Type of every reply, in order."""
        return self._recorder.reply_types

    @property
    def request_headers(self) -> list[CIMultiDict[str]]:
        """With record_replies: the headers of every request received, in order."""
        return self._recorder.request_headers

    @property
    def stats(self) -> SimStats:
        """Live counters (the same object throughout)."""
        return self.engine.stats

    async def wait_for(self, predicate: Callable[[SimStats], bool], timeout: float) -> None:  # noqa: ASYNC109
        """Return once ``predicate(stats)`` holds; TimeoutError after ``timeout`` seconds.

        Woken by every state change, never by polling."""
        await self.engine.wait_for(predicate, timeout)

    def loaded_models(self) -> dict[str, float]:
        """Loaded model -> when it unloads (on the simulator's clock; inf = never)."""
        return self.engine.loaded_models()

    def idle(self, model: str) -> bool:
        """Whether ``model`` is loaded with no request holding it: its keep-alive runs."""
        runner = self.engine.scheduler.loaded.get(model)
        return runner is not None and runner.refs <= 0

    def expire_all(self) -> None:
        """Unload every model, as if each keep_alive had run out."""
        self.engine.expire_all()

    def make_app(self) -> web.Application:
        # Neither Ollama (gin) nor llama-server (cpp-httplib) bounds a request body; aiohttp's
        # default would refuse images over 1 MiB with a 413 of its own.
        app = web.Application(middlewares=[self._recorder.middleware], client_max_size=2**30)
        if self.config.flavor == "llamacpp":
            LlamaCppAPI(self.engine).add_routes(app)
        else:
            native = OllamaAPI(self.engine)
            native.add_routes(app)
            OpenAICompatAPI(native).add_routes(app)
            app.router.add_post("/v1/messages", functools.partial(messages, native))
            app.router.add_post("/v1/responses", functools.partial(responses, native))
        app.router.add_get("/sim/stats", self._stats)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_startup(self, app: web.Application) -> None:
        self.engine.started_at = self.engine.clock()
        if self.config.flavor == "llamacpp":
            # llama-server loads its one model at start; /health says 503 meanwhile.
            self.engine.stats.loads += 1
            self.engine.changed()

    async def _on_shutdown(self, app: web.Application) -> None:
        await self.engine.shutdown()

    async def _stats(self, request: web.Request) -> web.Response:
        # Field by field: asdict would copy the whole prompts list on every poll.
        lists = ("prompts", "unloaded")
        names = [f.name for f in dataclasses.fields(self.stats) if f.name not in lists]
        stats: dict[str, float] = {name: getattr(self.stats, name) for name in names}
        stats["prompts_count"] = len(self.stats.prompts)
        return web.json_response(stats)


def run_sim(config: SimConfig, host: str = "127.0.0.1", port: int = 11434) -> None:
    """Serve a simulator until interrupted, printing where it listens."""
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(config, host, port))


async def _serve(config: SimConfig, host: str, port: int) -> None:
    simulator = Simulator(config)
    runner = web.AppRunner(simulator.make_app(), handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound_host, bound_port = runner.addresses[0][:2]
        if config.flavor == "llamacpp":
            what = f"llama-server ({config.parallel} slot(s), model {config.models[0]})"
        else:
            what = f"Ollama ({config.parallel} slot(s), models {', '.join(config.models)})"
        print(
            f"fairgate sim: simulated {what} listening on http://{bound_host}:{bound_port}",
            flush=True,
        )
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
