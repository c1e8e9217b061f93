"""Copies of what the simulator received and sent, for byte-for-byte relay tests."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from multidict import CIMultiDict

__all__ = ["Recorder", "TapStream"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class TapStream(web.StreamResponse):
    """A streamed reply that keeps a copy of its body when the simulator records replies.

    By default its head goes out with its first bytes, in one send, as Ollama's does: Go's
    net/http writes a reply's head on its first Write, and Ollama flushes each line after
    writing it. ``head_first``: the head goes out alone, at once, as llama-server's does
    (cpp-httplib writes it before the stream's content provider runs: measured on the
    llama-server the tests build, the head 3 ms after the request, the first event after
    its prefill).
    """

    def __init__(self, content_type: str, *, keep: bool, head_first: bool = False) -> None:
        super().__init__(headers={"Content-Type": content_type})
        self._send_headers_immediately = head_first
        self.keep = keep
        self.copy = bytearray()

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.keep:
            self.copy.extend(data)
        await super().write(data)


class Recorder:
    """Request headers, reply bodies and reply Content-Types, in arrival order."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.request_headers: list[CIMultiDict[str]] = []
        self.replies: list[bytes] = []
        self.reply_types: list[str] = []

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.enabled or request.path.startswith("/sim/"):
            return await handler(request)
        self.request_headers.append(request.headers.copy())
        response = await handler(request)
        if isinstance(response, TapStream):
            body = bytes(response.copy)
        elif isinstance(response, web.Response) and isinstance(response.body, bytes):
            body = response.body
        else:
            body = b""
        self.replies.append(body)
        self.reply_types.append(response.headers.get("Content-Type", ""))
        return response
