"""What the generation handler spends on a request before admission, in microseconds.

From ``Generation.generate``'s first line to the ``Ticket`` it hands to admission: who is
calling, the budget and the early refusal, reading the body, the JSON parse with its
ambiguity check and Ollama's field types, the model's alias, access and backends, the
keep_alive and num_ctx rules, the estimate and the lane. All of it is on the critical
path of every request. Here the real handler runs on requests shaped like a client's
(their headers, a loopback peer, the body already arrived as it is for a chat), in a
gateway built by ``create_app`` with a household's policy; admission's ``acquire`` is
replaced by one that stops the handler, so nothing is relayed. Each body is timed alone:

- ``chat``: a streamed Ollama ``/api/chat`` of a few messages (about 700 bytes);
- ``chat-options``: the same with ``options`` and ``keep_alive`` under a num_ctx rule;
- ``owui-task``: Open WebUI's follow-ups request (samples/open-webui, 1.8 KB);
- ``openai``: a streamed ``/v1/chat/completions`` (about 700 bytes);
- ``tiny``: the 71-byte body ``overhead.py`` sends;
- ``bench``: that body as ``overhead.py`` and the profiles send it: no key, to a gateway
  with no users (``defaults:`` and one backend).

    python -m benchmarks.intake [--requests 20000]

Old code against new, side by side in one run (each tree in its own processes, taking
turns; the best of the rounds):

    git archive main | tar -x -C /tmp/old
    python -m benchmarks.intake --tree /tmp/old --tree . [--rounds 5]
"""

from __future__ import annotations

import asyncio
import gc
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import HttpVersion11, web
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from multidict import CIMultiDict, CIMultiDictProxy, istr
from yarl import URL

from benchmarks import bookkeeping
from gateway.admission.permit import Permit
from gateway.admission.refusals import Refusal
from gateway.admission.tickets import Ticket
from gateway.app import SERVICES, create_app
from gateway.config.policy import parse_policy
from gateway.config.settings import Settings
from gateway.edge.http.access_log import RECORD
from gateway.edge.record import RequestRecord
from gateway.routes.generation import Generation

_HEADERS = {
    "Host": "127.0.0.1:8080",
    "User-Agent": "ollama-python/0.6.1 (x86_64 linux) Python/3.11.7",
    "Accept": "application/json",
    "Accept-Encoding": "gzip, deflate",
    "Connection": "keep-alive",
    "Authorization": "Bearer alice-key",
    "Content-Type": "application/json",
}
# A household: keys, a model list for one user, a budget for another, two backends.
_POLICY = """\
users:
  alice: {keys: [alice-key], max_concurrent: 2}
  kids: {keys: [kids-key], models: ["llama3.2:3b"], budget: {requests_per_hour: 50}}
  tv: {clients: ["192.168.1.50/32"]}
aliases: {fast: "llama3.2:3b"}
backends:
  - {name: gpu, url: "http://127.0.0.1:9", kind: ollama, slots: 4}
  - {name: cpu, url: "http://127.0.0.1:10", kind: llamacpp, slots: 2}
"""
# What overhead.py and the profiles run: anybody, one backend.
_OPEN = """\
defaults: {max_concurrent: 400, max_queued: 0}
backends:
  - {name: stub, url: "http://127.0.0.1:9", kind: ollama, slots: 100000}
"""
# The household's, with the rules a household sets against reloads.
_RULES = "num_ctx: {max: 8192}\nkeep_alive: {max: 1h}\n"
_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "Plan a 3-day trip to Lisbon for a family of four."},
    {
        "role": "assistant",
        "content": "Day 1: Alfama and the castle; day 2: Belem and the riverside; "
        "day 3: Sintra by train. Book the tram early and carry water for the hills.",
    },
    {"role": "user", "content": "What should we eat on day 2, near Belem? Keep it cheap."},
]
_OWUI = Path("/work/shared/samples/open-webui/follow-ups-request.json")


def _bodies() -> dict[str, tuple[str, bytes, str, bool]]:
    """By name: the path, the body as a client sends it (compact JSON), the policy, and
    whether the request carries a key."""
    chat = {"model": "llama3.2:3b", "messages": _MESSAGES, "stream": True}
    options = {**chat, "options": {"num_ctx": 4096, "temperature": 0.7}, "keep_alive": "10m"}
    openai = {
        "model": "llama3.2:3b",
        "messages": _MESSAGES,
        "stream": True,
        "temperature": 0.7,
        "stream_options": {"include_usage": True},
    }
    tiny = b'{"model":"llama3.2:3b","messages":[{"role":"user","content":"bench"}]}'
    bodies = {
        "chat": ("/api/chat", _compact(chat), _POLICY, True),
        "chat-options": ("/api/chat", _compact(options), _POLICY + _RULES, True),
        "openai": ("/v1/chat/completions", _compact(openai), _POLICY, True),
        "tiny": ("/api/chat", tiny, _POLICY, True),
        "bench": ("/api/chat", tiny, _OPEN, False),
    }
    if _OWUI.exists():
        owui = _compact(json.loads(_OWUI.read_bytes()))
        bodies["owui-task"] = ("/api/chat", owui, _POLICY, True)
    return bodies


def _compact(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class _Admitted(Exception):
    """Stops the handler where admission would begin."""


def _no_quick_yes(ticket: Ticket) -> None:
    return None


async def _stop(ticket: Ticket) -> Permit | Refusal:
    raise _Admitted


def measure(requests: int, rounds: int = 10) -> dict[str, float]:
    """Microseconds per request for each body, in this process's ``gateway``."""
    return asyncio.run(_measure(requests, rounds))


async def _measure(requests: int, rounds: int) -> dict[str, float]:
    directory = tempfile.mkdtemp(prefix="intake-")
    settings = Settings(usage_db=Path(directory) / "usage.db")
    loop = asyncio.get_running_loop()
    figures: dict[str, float] = {}
    for name, (path, body, policy, keyed) in _bodies().items():
        app = create_app(settings, parse_policy(policy))
        services = app[SERVICES]
        # The quick yes says nothing, so the ticket goes to acquire, which stops the handler.
        services.admission.at_once = _no_quick_yes  # type: ignore[method-assign]
        services.admission.acquire = _stop  # type: ignore[method-assign]
        generate = Generation(services).generate
        runs = []
        # In batches, the least disturbed one counts: the machine is shared, and what
        # others take only ever adds.
        for _ in range(rounds):
            fresh = [_request(path, body, keyed, loop) for _ in range(requests // rounds)]
            for request in fresh:  # as the access log does, before the handler
                record = RequestRecord("0", request.method, request.path, services.locate(request))
                request[RECORD] = record
            runs.append(await _timed(generate, fresh))
        figures[name] = min(runs)
    return figures


async def _timed(generate: Any, requests: list[web.Request]) -> float:
    """Microseconds per request up to admission."""
    gc.collect()
    start = time.perf_counter()
    for request in requests:
        try:  # noqa: SIM105  # not contextlib.suppress: its object would be timed too
            await generate(request)
        except _Admitted:
            pass
    return (time.perf_counter() - start) / len(requests) * 1e6


def _request(path: str, body: bytes, keyed: bool, loop: asyncio.AbstractEventLoop) -> web.Request:
    """A request as aiohttp's parser makes it, its body already arrived (a chat's comes in
    the same read as its head)."""
    fields = {**_HEADERS, "Content-Length": str(len(body))}
    if not keyed:
        del fields["Authorization"]
    raw = tuple((name.encode(), value.encode()) for name, value in fields.items())
    headers = CIMultiDictProxy(CIMultiDict((istr(k), v) for k, v in fields.items()))
    url = URL.build(path=path, query_string="", fragment="", encoded=True)
    message = RawRequestMessage(
        "POST", path, HttpVersion11, headers, raw, False, None, False, False, url
    )
    protocol = _Payload()
    payload = StreamReader(protocol, 2**16, loop=loop)  # type: ignore[arg-type]
    payload.feed_data(body)
    payload.feed_eof()
    return web.Request(message, payload, protocol, None, None, loop)  # type: ignore[arg-type]


class _Payload(bookkeeping._Protocol):
    """What a request's payload reads of its connection's handler too."""

    _reading_paused = False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


def report(trees: list[str], best: list[dict[str, float]]) -> None:
    """The trees' microseconds per request up to admission, body by body."""
    from benchmarks.trees import print_header, print_row

    print_header("us up to admission", trees)
    for name in best[0]:
        print_row(name, [figures[name] for figures in best])


if __name__ == "__main__":
    from benchmarks.trees import run

    run(__file__, __doc__ or "", measure, report, requests=20_000)
