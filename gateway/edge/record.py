"""What happened to one request: the record its handler fills in, read when it ends by the
access log, the metrics, the history and the ledger; and the relay's report of one reply.

It sits low (it imports only the core's words and the client's address) so that everything
that reads a record can import it without the middleware that writes the log.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.core import GENERATION_PATHS, Lane, Reason, RequestClass
from gateway.edge.forwarded import Client

__all__ = ["NOWHERE", "Progress", "RecordListener", "RequestRecord"]


@dataclass(slots=True)
class Progress:
    """What happened to one relayed reply, for the handler to read when it ends."""

    first_byte_at: float | None = None
    bytes_out: int = 0
    gaps: list[float] = field(default_factory=list)  # seconds between reads of the reply
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # of the prompt's, read from the engine's cache
    completion_tokens: int | None = None
    load_seconds: float | None = None  # Ollama's load_duration: the reply paid for a load
    failure: Reason | None = None  # the reply was cut after its first byte
    client_gone: bool = False


NOWHERE = Client(None)
"""The client of a record made outside a request (tests, tools)."""


@dataclass(slots=True)
class RequestRecord:
    """What happened to one request; read by the access log (and by metrics)."""

    request_id: str
    method: str
    path: str
    client: Client = NOWHERE  # where it came from, behind the trusted proxies
    arrived: float = field(default_factory=time.monotonic)
    finished: float = 0.0
    user: str | None = None
    model: str | None = None
    request_class: RequestClass | None = None
    lane: Lane | None = None
    input_estimate: int | None = None  # the whole prompt, estimated from the body
    uncached_estimate: int | None = None  # of it, what the engine was expected to evaluate
    backend: str | None = None
    status: int = 0
    reason: Reason | None = None
    bytes_out: int = 0
    queue_wait: float | None = None
    queue_position: int | None = None  # in the waiting room on arrival; 0: started at once
    dispatched_at: float | None = None
    first_byte_at: float | None = None
    gaps: list[float] = field(default_factory=list)  # seconds between chunks of the reply
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # of the prompt's, read from the engine's cache
    completion_tokens: int | None = None
    streamed_tokens: int = 0  # counted as the reply streamed (when it reports no counts)
    load_seconds: float | None = None
    client_gone: bool = False
    retried: bool = False  # sent to a second backend after the first failed
    restarts: int = 0  # times it gave its slot to a person and ran again (background work)
    given_way_seconds: float = 0.0  # the waits and runs of the turns it gave up
    client_request_id: str | None = None  # a client's X-Request-Id not used as ours

    @property
    def generation(self) -> bool:
        """Whether it asked a model for something (``GENERATION_PATHS``): what the metrics and
        the house's history count as the household's requests, and not a listing, a count of
        tokens or a page's poll."""
        return self.path in GENERATION_PATHS

    def add(self, progress: Progress) -> None:
        """Take in what the relay reported of the reply."""
        self.first_byte_at = progress.first_byte_at
        self.bytes_out += progress.bytes_out
        self.gaps = progress.gaps
        self.prompt_tokens = progress.prompt_tokens
        self.cached_tokens = progress.cached_tokens
        self.completion_tokens = progress.completion_tokens
        self.load_seconds = progress.load_seconds
        self.client_gone = self.client_gone or progress.client_gone
        if progress.failure is not None:
            self.reason = progress.failure
        if progress.client_gone:
            self.status = 499

    def fields(self) -> dict[str, object]:
        done = self.finished or time.monotonic()
        ttft = None if self.first_byte_at is None else round(self.first_byte_at - self.arrived, 4)
        wait = None if self.queue_wait is None else round(self.queue_wait, 4)
        fields: dict[str, object] = {
            "request_id": self.request_id,
            "client": str(self.client),
            "method": self.method,
            "path": self.path,
            "user": self.user,
            "model": self.model,
            "class": self.request_class,
            "lane": self.lane,
            "input_estimate": self.input_estimate,
            "uncached_estimate": self.uncached_estimate,
            "backend": self.backend,
            "status": self.status,
            "reason": self.reason,
            "bytes": self.bytes_out,
            "queue_wait_s": wait,
            "queue_position": self.queue_position,
            "ttft_s": ttft,
            "total_s": round(done - self.arrived, 4),
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "load_s": self.load_seconds,
            "client_gone": self.client_gone,
            "retried": self.retried,
        }
        if self.restarts:
            fields["restarts"] = self.restarts
        if self.client.proxy is not None:
            fields["proxy"] = str(self.client.proxy)
        if self.client_request_id is not None:
            fields["client_request_id"] = self.client_request_id
        return fields


RecordListener = Callable[[RequestRecord], None]
