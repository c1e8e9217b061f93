"""Browser apps on other origins: preflights answered for listed origins only, replies (streams
and refusals too) readable by them only, and nothing of it unless the policy lists origins.

The headers are asserted exactly; then a real browser (Debian's chromium, headless, driven by
playwright) streams a chat from a page on a listed origin and fails from another.
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy
from playwright.async_api import Browser

from tests.conftest import Gateway, StartGateway, StartSim, one_backend, serve
from tests.test_admission import MODEL

APP = "http://127.0.0.1:5173"  # a web chat's origin
ELSEWHERE = "https://elsewhere.example"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def policy(sim_url: str, origins: str = f"[{APP}]") -> str:
    users = "users:\n  alice: {keys: [alice-key]}\n"
    return one_backend(sim_url, slots=2, extra=users + f"cors: {{origins: {origins}}}\n")


def preflight(origin: str, method: str = "POST", headers: str = "") -> dict[str, str]:
    asked = {"Origin": origin, "Access-Control-Request-Method": method}
    return asked | ({"Access-Control-Request-Headers": headers} if headers else {})


async def send(
    gateway: Gateway, method: str, path: str, headers: dict[str, str], body: object = None
) -> tuple[int, CIMultiDictProxy[str], bytes]:
    """Status, headers and body of one request."""
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, gateway.url + path, headers=headers, json=body) as reply,
    ):
        return reply.status, reply.headers, await reply.read()


class TestPreflight:
    async def test_a_listed_origin_is_answered_without_a_key(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """204 with the origin, the methods, the headers the page asked for, and a max age."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        asked = "authorization,content-type,x-stainless-os"
        status, headers, _ = await send(
            gateway, "OPTIONS", "/v1/chat/completions", preflight(APP, headers=asked)
        )
        assert status == 204
        assert {
            name: headers.get(name)
            for name in (
                "Access-Control-Allow-Origin",
                "Access-Control-Allow-Methods",
                "Access-Control-Allow-Headers",
                "Access-Control-Max-Age",
                "Vary",
            )
        } == {
            "Access-Control-Allow-Origin": APP,
            "Access-Control-Allow-Methods": "GET, HEAD, POST",
            "Access-Control-Allow-Headers": asked,
            "Access-Control-Max-Age": "600",
            "Vary": "Origin",
        }

    async def test_another_origin_is_refused_and_told_why(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """403 origin_forbidden, with no CORS header a browser could act on."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        with structlog.testing.capture_logs() as logs:
            status, headers, body = await send(
                gateway, "OPTIONS", "/api/chat", preflight(ELSEWHERE)
            )
        assert status == 403
        assert "list it under cors.origins" in json.loads(body)["error"]
        assert "Access-Control-Allow-Origin" not in headers
        # The admin's side: the log names the origin to list.
        refused = [line for line in logs if line["event"] == "origin_forbidden"]
        assert [line["origin"] for line in refused] == [ELSEWHERE]

    async def test_without_origins_in_the_policy_every_preflight_is_refused(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The default: CORS is off; the refusal says where to turn it on."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url))
        status, headers, _ = await send(gateway, "OPTIONS", "/api/tags", preflight(APP, "GET"))
        assert status == 403
        assert "Access-Control-Allow-Origin" not in headers


class TestReplies:
    async def test_a_stream_to_a_listed_origin_carries_the_headers_from_its_first_byte(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The streamed chat's head names the origin and exposes the request id and waits."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        asked = {"Origin": APP, "Authorization": "Bearer alice-key"}
        status, headers, body = await send(gateway, "POST", "/api/chat", asked, CHAT)
        assert status == 200 and len(body.splitlines()) > 1
        assert headers["Access-Control-Allow-Origin"] == APP
        assert headers["Vary"] == "Origin"
        exposed = headers["Access-Control-Expose-Headers"]
        assert "X-Request-Id" in exposed and "Retry-After" in exposed

    @pytest.mark.parametrize(("origin", "allowed"), [(APP, [APP]), (ELSEWHERE, [])])
    async def test_a_backends_own_vary_stays_beside_the_gateways_and_its_cors_gives_way(
        self, start_gateway: StartGateway, servers: AsyncExitStack, origin: str, allowed: list[str]
    ) -> None:
        """A streamed reply whose backend says Vary and CORS of its own: its Vary is kept and
        Origin added to it; its CORS and request id give way to the gateway's, also for an
        origin the gateway does not list (Ollama allows localhost pages of its own accord)."""

        async def listing(request: web.Request) -> web.Response:
            return web.json_response({"models": [{"name": MODEL, "model": MODEL}]})

        async def chat(request: web.Request) -> web.StreamResponse:
            own = {
                "Vary": "Accept-Encoding",
                "Access-Control-Allow-Origin": "*",
                "Access-Control-Allow-Credentials": "true",
            }
            reply = web.StreamResponse(headers=own | {"X-Request-Id": "the-backends"})
            reply.content_type = "application/x-ndjson"
            await reply.prepare(request)
            await reply.write(b'{"message":{"content":"hi"},"done":false}\n')
            await reply.write(b'{"message":{"content":""},"done":true,"eval_count":1}\n')
            return reply

        app = web.Application()
        for path in ("/api/version", "/api/tags", "/api/ps"):
            app.router.add_get(path, listing)
        app.router.add_post("/api/chat", chat)
        gateway = await start_gateway(policy(await serve(servers, app)))
        asked = {"Origin": origin, "Authorization": "Bearer alice-key"}
        status, headers, body = await send(gateway, "POST", "/api/chat", asked, CHAT)
        assert status == 200 and len(body.splitlines()) == 2
        assert headers.getall("Vary") == ["Accept-Encoding", "Origin"]
        assert headers.getall("Access-Control-Allow-Origin", []) == allowed
        assert "Access-Control-Allow-Credentials" not in headers
        assert headers.getall("X-Request-Id") != ["the-backends"]

    @pytest.mark.parametrize(
        ("path", "body"), [("/api/chat", CHAT), ("/api/show", {"model": MODEL})]
    )
    async def test_a_listed_origin_is_served_by_an_ollama_that_does_not_list_it(
        self, start_sim: StartSim, start_gateway: StartGateway, path: str, body: object
    ) -> None:
        """Ollama answers a bare 403 to an Origin its own OLLAMA_ORIGINS does not list; with
        origins listed the gateway answers for CORS, and the page's Origin goes no further."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url, f"[{ELSEWHERE}]"))
        asked = {"Origin": ELSEWHERE, "Authorization": "Bearer alice-key"}
        status, headers, _ = await send(gateway, "POST", path, asked, body)
        assert status == 200
        assert headers.getall("Access-Control-Allow-Origin") == [ELSEWHERE]

    async def test_a_refusal_to_a_listed_origin_is_readable_by_its_page(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A 401 carries the origin too, so the page can show the gateway's words."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        status, headers, _ = await send(gateway, "POST", "/api/chat", {"Origin": APP}, CHAT)
        assert status == 401
        assert headers["Access-Control-Allow-Origin"] == APP

    @pytest.mark.parametrize(("origins", "vary"), [(f"[{APP}]", "Origin"), ("[]", None)])
    async def test_a_reply_to_another_origin_has_no_cors_headers(
        self, start_sim: StartSim, start_gateway: StartGateway, origins: str, vary: str | None
    ) -> None:
        """Served (a key is authority the page was given, not one its browser carries) but
        unreadable by that page; with CORS off, untouched."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url, origins))
        asked = {"Origin": ELSEWHERE, "Authorization": "Bearer alice-key"}
        status, headers, _ = await send(gateway, "GET", "/api/tags", asked)
        assert status == 200
        assert "Access-Control-Allow-Origin" not in headers
        assert headers.get("Vary") == vary


class TestPagesWithoutAKey:
    """A web page rides on its browser's address: one on another origin is refused unless it
    brings a key or the policy lists its origin."""

    @pytest.mark.parametrize(
        "origin", [ELSEWHERE, "null", "rebound", ELSEWHERE.upper(), APP.upper(), "", "x"]
    )
    async def test_a_page_elsewhere_cannot_chat_as_the_machine_it_runs_on(
        self, start_sim: StartSim, start_gateway: StartGateway, origin: str
    ) -> None:
        """A POST with no preflight (text/plain) from a page on another origin, from a
        sandboxed frame, or from a site that rebound its name to the gateway's address (its
        origin then names the very Host it asks), gets 403 and never reaches the backend; so
        do origins no browser sends, which once passed as an app's scheme: a page's scheme
        in capitals (a listed origin's too: it is listed as spelled), an empty or made-up
        Origin."""
        sim, sim_url = await start_sim()
        gateway = await start_gateway(by_address(sim_url, origins=f"[{APP}]"))
        if origin == "rebound":
            origin = gateway.url  # what the page's Origin and its request's Host then say
        headers = {"Origin": origin, "Content-Type": "text/plain"}
        with structlog.testing.capture_logs() as logs:
            status, _, body = await send(gateway, "POST", "/api/chat", headers, CHAT)
        assert status == 403 and "cors.origins" in json.loads(body)["error"]
        assert sim.stats.max_running == 0
        refused = [line for line in logs if line["event"] == "origin_forbidden"]
        assert [(line["origin"], line["user"]) for line in refused] == [(origin, "house")]

    async def test_two_origins_are_no_origin_the_gateway_takes(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A browser sends one Origin; of two, a listed one first, neither is taken."""
        sim, sim_url = await start_sim()
        gateway = await start_gateway(by_address(sim_url, origins=f"[{APP}]"))
        headers = CIMultiDict([("Origin", APP), ("Origin", ELSEWHERE)])
        async with (
            aiohttp.ClientSession() as session,
            session.post(gateway.url + "/api/chat", headers=headers, json=CHAT) as reply,
        ):
            assert reply.status == 403
        assert sim.stats.max_running == 0

    async def test_an_open_gateway_refuses_a_page_elsewhere_too(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """With no users at all, the page would run as anyone: the same 403 (with origins
        listed, so that the gateway and not Ollama's own check is what refuses)."""
        sim, sim_url = await start_sim()
        gateway = await start_gateway(one_backend(sim_url, extra=f"cors: {{origins: [{APP}]}}\n"))
        status, _, _ = await send(gateway, "POST", "/api/chat", {"Origin": ELSEWHERE}, CHAT)
        assert status == 403 and sim.stats.max_running == 0

    @pytest.mark.parametrize("origin", [APP, "chrome-extension://abcdefghijklmnop"])
    async def test_a_listed_origin_and_an_extension_are_served(
        self, start_sim: StartSim, start_gateway: StartGateway, origin: str
    ) -> None:
        """A listed origin's page may use the address it runs at; an extension's scheme is
        the backend's to judge."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(by_address(sim_url, origins=f"[{APP}]"))
        status, _, _ = await send(gateway, "POST", "/api/chat", {"Origin": origin}, CHAT)
        assert status == 200

    async def test_a_listed_origins_page_on_the_gateways_machine_is_not_its_admin(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A chat app's page may chat from the gateway's own machine, but its fetch of
        /status (which loopback alone may read) is refused: its Origin says whose it is."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(policy(sim_url))
        status, _, _ = await send(gateway, "GET", "/status", {})
        assert status == 200  # the house page's own GET says no Origin
        status, _, body = await send(gateway, "GET", "/status", {"Origin": APP})
        assert status == 401 and b"backends" not in body


def by_address(sim_url: str, origins: str) -> str:
    users = "users:\n  house: {clients: [127.0.0.1/32]}\n"
    return one_backend(sim_url, slots=2, extra=users + f"cors: {{origins: {origins}}}\n")


class TestOriginsInThePolicy:
    @pytest.mark.parametrize(
        ("written", "kept"),
        [
            ("https://Chat.Example.com", "https://chat.example.com"),
            ("https://chat.example.com:443", "https://chat.example.com"),
            ("http://localhost:3000/", "http://localhost:3000"),
        ],
    )
    def test_an_origin_is_kept_as_a_browser_sends_it(self, written: str, kept: str) -> None:
        """Case and a default port are normalised, so the admin's spelling still matches."""
        from gateway.config.policy import parse_policy

        parsed = parse_policy(policy("http://127.0.0.1:1", f"['{written}']"))
        assert parsed.cors.origins == [kept]

    def test_an_origin_with_a_path_is_refused_with_what_was_meant(self) -> None:
        """A URL is not an origin: the error names the line and the origin to write."""
        from gateway.config.policy import parse_policy
        from gateway.config.yaml_reader import PolicyError

        with pytest.raises(PolicyError) as refused:
            parse_policy(policy("http://127.0.0.1:1", "[https://chat.lan/app]"), source="p.yaml")
        assert str(refused.value) == (
            "p.yaml:5: cors.origins[0]: an origin has no user, path or query; "
            "did you mean 'https://chat.lan'? (got 'https://chat.lan/app')"
        )


# A real browser -------------------------------------------------------------------------


async def web_app(servers: AsyncExitStack) -> str:
    """A page to run the web chat's script in; its port is its origin's."""

    async def page(request: web.Request) -> web.Response:
        return web.Response(text="<!doctype html><title>chat</title>", content_type="text/html")

    app = web.Application()
    app.router.add_get("/", page)
    return await serve(servers, app)


# What a web chat does: a streamed chat with a key, read chunk by chunk as it arrives.
STREAM = """
async ([url, key, body]) => {
  try {
    const reply = await fetch(url + "/api/chat", {
      method: "POST",
      headers: {"Authorization": "Bearer " + key, "Content-Type": "application/json"},
      body: JSON.stringify(body),
    });
    const reader = reply.body.getReader();
    const decoder = new TextDecoder();
    let text = "", chunks = 0;
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      chunks += 1;
      text += decoder.decode(value, {stream: true});
    }
    const lines = text.trim().split("\\n").map(line => JSON.parse(line));
    return {status: reply.status, chunks, last: lines[lines.length - 1],
            requestId: reply.headers.get("X-Request-Id")};
  } catch (error) {
    return {error: String(error)};
  }
}
"""


async def test_a_browser_streams_a_chat_from_a_listed_origin_and_not_from_another(
    start_sim: StartSim, start_gateway: StartGateway, servers: AsyncExitStack, browser: Browser
) -> None:
    """From the listed origin the page reads the stream to its done line (and the request
    id); from the same page under another name (localhost), the browser refuses it."""
    _, sim_url = await start_sim()
    page_url = await web_app(servers)
    gateway = await start_gateway(policy(sim_url, f"[{page_url}]"))
    results: dict[str, Any] = {}
    for origin in (page_url, page_url.replace("127.0.0.1", "localhost")):
        page = await browser.new_page()
        try:
            await page.goto(origin + "/")
            results[origin] = await page.evaluate(STREAM, [gateway.url, "alice-key", CHAT])
        finally:
            await page.close()
    listed, other = results.values()
    assert listed["status"] == 200 and listed["last"]["done"] is True
    assert listed["chunks"] >= 1 and listed["requestId"]
    assert other == {"error": "TypeError: Failed to fetch"}
