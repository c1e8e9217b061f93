"""The floors of the gateway's stack: relays with no logic at all, on uvloop.

Each passes the request on and streams the reply back as it arrives, and does nothing else:
no identity, admission, metrics or logs. overhead.py measures them beside the gateway, so
that what the stack costs is not taken for the gateway's own logic, and what it would cost
on another stack is known before it is built:

- ``aiohttp``: aiohttp's server and its client, what the gateway was first built on;
- ``aiohttp-server``: aiohttp's server and the gateway's own backend client
  (``gateway/relay/upstream_client.py``): the gateway's stack today, with its logic taken out;
- ``protocol``: an asyncio protocol on httptools (llhttp, the C parser of the backend
  client) and the gateway's backend client: the floor of a relay off aiohttp's server.
  A benchmark's server, not a product's: keep-alive and Content-Length bodies only, no
  limits, no hostile clients.

    python -m benchmarks.bare_relay --stack aiohttp --port 8081 --upstream http://127.0.0.1:11434
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import cast

import aiohttp
import httptools
from aiohttp import web
from multidict import CIMultiDict

from gateway.app import new_event_loop
from gateway.relay.upstream_client import BackendClient

SESSION = web.AppKey("session", aiohttp.ClientSession)
CLIENT = web.AppKey("client", BackendClient)
UPSTREAM = web.AppKey("upstream", str)
_CONNECT, _FIRST_BYTE = 5.0, 60.0  # seconds
STACKS = ("aiohttp", "aiohttp-server", "protocol")


async def aiohttp_relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
    url = request.app[UPSTREAM] + request.path_qs
    async with request.app[SESSION].request(
        request.method, url, data=body, headers=headers
    ) as upstream:
        response = web.StreamResponse(status=upstream.status)
        response.content_type = upstream.content_type
        await response.prepare(request)
        while chunk := await upstream.content.readany():
            await response.write(chunk)
        await response.write_eof()
        return response


class _HeadWithBody(web.StreamResponse):
    _send_headers_immediately = False  # the head goes out with the first bytes, as the gateway's


async def aiohttp_server_relay(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    headers = CIMultiDict({"Content-Type": "application/json"})
    url = request.app[UPSTREAM] + request.path_qs
    client = request.app[CLIENT]
    async with await client.request(
        request.method, url, headers, body, connect_timeout=_CONNECT, first_byte=_FIRST_BYTE
    ) as upstream:
        first = await upstream.first()
        response = _HeadWithBody(status=upstream.status)
        response.content_type = upstream.headers.get("Content-Type", "application/json")
        await response.prepare(request)
        await response.write(first)
        transport = request.transport
        assert transport is not None
        upstream.pass_to(lambda data, _: transport.write(b"%x\r\n%b\r\n" % (len(data), data)))
        await upstream.passed()
        await response.write_eof()
        return response


class ProtocolRelay(asyncio.Protocol):
    """One client connection: each request relayed when its body is complete."""

    def __init__(self, client: BackendClient, upstream: str) -> None:
        self._client, self._upstream = client, upstream
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url, self._body = b"", [b""]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._parser.feed_data(data)

    def on_message_begin(self) -> None:
        self._url, self._body = b"", []

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        method = self._parser.get_method().decode()
        relay = self._relay(method, self._url.decode(), b"".join(self._body))
        asyncio.get_running_loop().create_task(relay)

    async def _relay(self, method: str, target: str, body: bytes) -> None:
        headers = CIMultiDict({"Content-Type": "application/json"})
        url = self._upstream + target
        reply = await self._client.request(
            method, url, headers, body, connect_timeout=_CONNECT, first_byte=_FIRST_BYTE
        )
        async with reply:
            first = await reply.first()
            transport = self._transport
            assert transport is not None
            kind = reply.headers.get("Content-Type", "application/json").encode()
            transport.write(
                b"HTTP/1.1 %d %b\r\nContent-Type: %b\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"%x\r\n%b\r\n" % (reply.status, reply.reason.encode(), kind, len(first), first)
            )
            reply.pass_to(lambda data, _: transport.write(b"%x\r\n%b\r\n" % (len(data), data)))
            await reply.passed()
            transport.write(b"0\r\n\r\n")


async def _backend_client(app: web.Application) -> AsyncIterator[None]:
    app[CLIENT] = client = BackendClient(256)
    yield
    await client.close()


async def _session(app: web.Application) -> AsyncIterator[None]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as client:
        app[SESSION] = client
        yield


async def _serve_protocol(port: int, upstream: str) -> None:
    client = BackendClient(256)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ProtocolRelay(client, upstream), "127.0.0.1", port)
    await server.serve_forever()


def main(stack: str, port: int, upstream: str) -> None:
    loop = new_event_loop("auto")
    if stack == "protocol":
        loop.run_until_complete(_serve_protocol(port, upstream))
        return
    app = web.Application()
    app[UPSTREAM] = upstream
    if stack == "aiohttp":
        app.cleanup_ctx.append(_session)
        app.router.add_route("*", "/{tail:.*}", aiohttp_relay)
    else:
        app.cleanup_ctx.append(_backend_client)
        app.router.add_route("*", "/{tail:.*}", aiohttp_server_relay)
    web.run_app(
        app, host="127.0.0.1", port=port, access_log=None, print=None, loop=loop,
        handler_cancellation=True,
    )  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stack", choices=STACKS, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    main(args.stack, args.port, args.upstream)
