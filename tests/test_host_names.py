"""DNS rebinding: a request without a key is answered only under a name the gateway answers
to; with a key, under any. A real browser shows the attack: a site's name resolved to the
gateway's address reads nothing, the gateway's own address reads as before."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import structlog
from playwright.async_api import Browser, async_playwright

from gateway.config.policy import parse_policy
from gateway.config.yaml_reader import PolicyError
from gateway.edge.host_names import answers_to
from tests.conftest import Gateway, StartGateway, StartSim, one_backend, required_binary
from tests.test_admission import MODEL

SITE = "rebind.example"  # a site's own name, pointed at the gateway's address
HOUSEHOLD = """\
users:
  tv: {clients: [127.0.0.1/32]}
  alice: {keys: [alice-key], admin: true}
"""
StartHousehold = Callable[..., Awaitable[Gateway]]
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": False}


@pytest.fixture
def household(start_sim: StartSim, start_gateway: StartGateway) -> StartHousehold:
    """A gateway in front of a simulator, its policy's users ``extra`` (the household's)."""

    async def start(extra: str = HOUSEHOLD) -> Gateway:
        _, sim_url = await start_sim()
        return await start_gateway(one_backend(sim_url, extra=extra))

    return start


async def ask(
    gateway: Gateway, path: str, host: str, key: str | None = None, body: object = None
) -> tuple[int, Any]:
    """Status and JSON body of one request sent with ``host`` as its Host header."""
    headers = {"Host": host} | ({"Authorization": f"Bearer {key}"} if key else {})
    method = "POST" if body is not None else "GET"
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, gateway.url + path, headers=headers, json=body) as reply,
    ):
        text = await reply.text()
        return reply.status, json.loads(text) if "json" in reply.content_type else text


class TestNames:
    @pytest.mark.parametrize(
        "host",
        [
            "127.0.0.1:8080", "192.168.1.20", "[::1]:11434", "[fe80::1]", "gpubox",
            "GPUBOX.:8080", "fairgate:8080", "localhost", "rebind.localhost:80",
            "box.local", "box.lan:8080", "box.home.arpa", "gpu.internal",
        ],
    )  # fmt: skip
    def test_an_address_or_a_local_name_is_answered(self, host: str) -> None:
        """Addresses, one-label names and local suffixes are names no outside site can own."""
        assert answers_to(host, ())

    @pytest.mark.parametrize(
        "host",
        [
            "rebind.example", "rebind.example:8080", "127.0.0.1.rebind.example",
            "local.example", "[gpubox]:80", "gpubox:http", "ev il", "1.2.3.4:",
        ],
    )  # fmt: skip
    def test_a_public_name_or_a_malformed_host_is_not(self, host: str) -> None:
        """A name under a public suffix could be any site's; a malformed Host is no name."""
        assert not answers_to(host, ())

    def test_a_listed_name_and_its_wildcard_are_answered(self) -> None:
        """``hosts:`` adds names: exactly, or below a ``*.`` suffix, or any with ``*``."""
        listed = ("gpu.example.com", "*.home.example")
        assert answers_to("GPU.example.com:443", listed)
        assert answers_to("box.home.example", listed)
        assert not answers_to("home.example", listed)
        assert not answers_to("gpu.example.com.evil.example", listed)
        assert answers_to("anything.example", ("*",))


class TestPolicy:
    def test_a_listed_host_is_kept_as_a_header_would_name_it(self) -> None:
        """Lower case, without a trailing dot, so that it matches."""
        policy = parse_policy(one_backend("http://127.0.0.1:1", extra="hosts: [GPU.Example.com.]"))
        assert policy.hosts == ("gpu.example.com",)

    @pytest.mark.parametrize("entry", ["https://gpu.example.com", "gpu.example.com:443", "*."])
    def test_a_url_or_a_port_in_hosts_is_an_error_that_says_what_is_meant(self, entry: str) -> None:
        """A URL or a port could never match a Host header: the file is refused, saying so."""
        with pytest.raises(PolicyError, match="no scheme, port or path"):
            parse_policy(one_backend("http://127.0.0.1:1", extra=f"hosts: ['{entry}']"))


class TestRequests:
    async def test_an_address_known_user_is_not_answered_under_a_sites_name(
        self, household: StartHousehold
    ) -> None:
        """403 host_forbidden, which says where to list the name, and one log line."""
        gateway = await household()
        with structlog.testing.capture_logs() as logs:
            status, body = await ask(gateway, "/api/tags", SITE)
        assert status == 403
        assert "hosts:" in body["error"]
        assert [line["host"] for line in logs if line["event"] == "host_forbidden"] == [SITE]
        assert (await ask(gateway, "/api/tags", "gpubox:8080"))[0] == 200

    async def test_a_key_is_answered_under_any_name(self, household: StartHousehold) -> None:
        """A page cannot have a key, so a request with one is answered however it names us."""
        gateway = await household()
        assert (await ask(gateway, "/api/tags", SITE, key="alice-key"))[0] == 200
        assert (await ask(gateway, "/api/chat", SITE, key="alice-key", body=CHAT))[0] == 200

    async def test_an_open_gateway_runs_no_chat_for_a_sites_name(
        self, household: StartHousehold
    ) -> None:
        """Without users everyone is anonymous: a site's name gets a 403, an address a reply."""
        gateway = await household("")  # no users: an open gateway
        status, body = await ask(gateway, "/api/chat", SITE, body=CHAT)
        assert (status, body["error"][:30]) == (403, "the gateway does not answer to")
        assert (await ask(gateway, "/api/chat", "127.0.0.1", body=CHAT))[0] == 200

    async def test_status_and_metrics_are_not_read_under_a_sites_name(
        self, household: StartHousehold
    ) -> None:
        """Loopback opens /status and anyone /metrics, but not under a name a site owns."""
        gateway = await household()
        for path in ("/status", "/metrics"):
            assert (await ask(gateway, path, SITE))[0] == 403
            assert (await ask(gateway, path, "127.0.0.1"))[0] == 200
        assert (await ask(gateway, "/status", SITE, key="alice-key"))[0] == 200

    async def test_metrics_with_a_users_key_are_answered_under_any_name(
        self, household: StartHousehold
    ) -> None:
        """A scraper that sends a user's key reads /metrics however it names the gateway, as
        every route answers a key; a key no user has is no key."""
        gateway = await household()
        assert (await ask(gateway, "/metrics", SITE, key="alice-key"))[0] == 200
        assert (await ask(gateway, "/metrics", SITE, key="nobody-key"))[0] == 403

    async def test_a_name_listed_under_hosts_is_answered(self, household: StartHousehold) -> None:
        """The public name a TLS proxy passes on, once listed."""
        gateway = await household(HOUSEHOLD + "hosts: [gpu.example.com]\n")
        assert (await ask(gateway, "/api/tags", "gpu.example.com:443"))[0] == 200
        assert (await ask(gateway, "/api/tags", SITE))[0] == 403


@pytest.fixture
async def rebound() -> AsyncIterator[Browser]:
    """Debian's chromium, with the site's name resolving to this machine: what a site's DNS
    does once its page has loaded (DNS rebinding)."""
    path = required_binary("chromium", "chromium")
    async with async_playwright() as playwright:
        engine = await playwright.chromium.launch(
            executable_path=path, args=[f"--host-resolver-rules=MAP {SITE} 127.0.0.1"]
        )
        yield engine
        await engine.close()


async def test_a_page_under_a_rebound_name_reads_nothing_in_a_real_browser(
    household: StartHousehold, rebound: Browser
) -> None:
    """The page loads (it is the site's own), but what it fetches from the gateway as the
    household's TV (by address) is refused; under the gateway's address the same reads."""
    gateway = await household()
    port = gateway.url.rsplit(":", 1)[1]
    page = await rebound.new_page()
    read = "Promise.all(['/api/tags', '/ui/me.json'].map(p => fetch(p).then(r => r.status)))"
    await page.goto(f"http://{SITE}:{port}/ui")
    assert await page.evaluate(read) == [403, 403]
    await page.goto(f"http://127.0.0.1:{port}/ui")
    assert await page.evaluate(read) == [200, 200]
