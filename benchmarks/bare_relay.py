"""The floor of the gateway's stack: an aiohttp relay with no logic at all, on uvloop.

One pooled ClientSession, the request passed on, the reply streamed back chunk by chunk as
the gateway does, and nothing else: no identity, admission, metrics or logs. overhead.py
measures it beside the gateway so that what aiohttp itself costs is not taken for ours.

    python -m benchmarks.bare_relay --port 8081 --upstream http://127.0.0.1:11434
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from gateway.app import new_event_loop

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)


async def relay(request: web.Request) -> web.StreamResponse:
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


async def session(app: web.Application) -> AsyncIterator[None]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256)) as client:
        app[SESSION] = client
        yield


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args()
    app = web.Application()
    app[UPSTREAM] = args.upstream
    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{tail:.*}", relay)
    web.run_app(
        app, host="127.0.0.1", port=args.port, access_log=None, print=None,
        loop=new_event_loop("auto"),
    )  # fmt: skip
