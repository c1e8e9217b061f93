"""The client's address behind trusted proxies: the headers are read only from a trusted peer,
from the right; what an untrusted peer says changes nothing; and the address found is the
one used for clients:, for the loopback rule of /status and in the access log.

The peers are real: loopback is a /8, so a connection from 127.0.0.2 (the trusted proxy) and
one from 127.0.0.3 (anyone else) are two machines as far as the gateway can tell.
"""

from __future__ import annotations

from ipaddress import ip_address, ip_network

import aiohttp
import pytest
import structlog
from multidict import CIMultiDict

from gateway.config.network import ForwardedHeader
from gateway.edge.forwarded import ProxyTrust
from tests.conftest import Finished, Gateway, StartGateway, StartSim, one_backend

PROXY, STRANGER = "127.0.0.2", "127.0.0.3"
TV = "192.168.1.50"
LAPTOP = "192.0.2.7"  # a machine elsewhere, as the proxy reports it
MODEL = "llama3.2:3b"


def trust(*networks: str, header: ForwardedHeader = "x-forwarded-for") -> ProxyTrust:
    return ProxyTrust([ip_network(n) for n in networks], header)


def client_of(proxies: ProxyTrust, peer: str, *headers: tuple[str, str]) -> str:
    return str(proxies.client_of(peer, CIMultiDict(headers)).address or "unknown")


class TestReadingTheHeaders:
    def test_an_untrusted_peer_is_the_client_whatever_it_says(self) -> None:
        """From a peer not in trusted_proxies, X-Forwarded-For and Forwarded are ignored."""
        proxies = trust("10.0.0.1/32")
        said = (("X-Forwarded-For", TV), ("Forwarded", f"for={TV}"))
        assert client_of(proxies, "10.0.0.9", *said) == "10.0.0.9"

    def test_the_right_most_hop_no_trusted_proxy_wrote_is_the_client(self) -> None:
        """What the client put to the left of its own address is skipped; trusted hops too."""
        proxies = trust("10.0.0.1/32", "10.0.0.2/32")
        forwarded = ("X-Forwarded-For", f"{TV}, {LAPTOP}, 10.0.0.2")
        assert client_of(proxies, "10.0.0.1", forwarded) == LAPTOP

    def test_when_every_hop_is_a_trusted_proxy_the_first_is_the_client(self) -> None:
        """A request from the proxy's own network, forwarded twice, is that machine's."""
        proxies = trust("10.0.0.0/24")
        assert client_of(proxies, "10.0.0.1", ("X-Forwarded-For", "10.0.0.7, 10.0.0.2")) == (
            "10.0.0.7"
        )

    def test_a_trusted_peer_without_the_header_is_the_client(self) -> None:
        """The proxy's own requests (a health check) come from the proxy."""
        assert client_of(trust("10.0.0.1/32"), "10.0.0.1") == "10.0.0.1"

    @pytest.mark.parametrize(
        ("hop", "address"),
        [
            ("192.0.2.7:4711", "192.0.2.7"),
            ("[2001:db8::1]:80", "2001:db8::1"),
            ("2001:db8::1", "2001:db8::1"),
            ("::ffff:192.0.2.7", "192.0.2.7"),
            ("unknown", "unknown"),
            ("_hidden", "unknown"),
            ("", "unknown"),
            ("not an address", "unknown"),
        ],
    )
    def test_a_hop_is_read_without_port_and_unreadable_hops_name_nobody(
        self, hop: str, address: str
    ) -> None:
        """Ports and brackets are dropped; a hop that is not an address gives no address."""
        assert client_of(trust("10.0.0.1/32"), "10.0.0.1", ("X-Forwarded-For", hop)) == address

    def test_several_header_lines_are_one_list_in_order(self) -> None:
        """Two X-Forwarded-For lines read as one, the last line's last hop nearest."""
        proxies = trust("10.0.0.1/32")
        lines = (("X-Forwarded-For", TV), ("X-Forwarded-For", LAPTOP))
        assert client_of(proxies, "10.0.0.1", *lines) == LAPTOP

    def test_forwarded_is_read_with_quotes_ports_and_parameters(self) -> None:
        """RFC 7239: for= of the last element, quoted IPv6 with a port, other pairs beside."""
        proxies = trust("10.0.0.1/32", header="forwarded")
        value = f'for={TV};proto=http, for="[2001:db8::17]:4711";proto=https;by=10.0.0.1'
        assert client_of(proxies, "10.0.0.1", ("Forwarded", value)) == "2001:db8::17"

    def test_a_stray_quote_from_the_client_cannot_swallow_the_proxys_element(self) -> None:
        """for=EVIL;by=" then the proxy's , for=REAL: unparseable, so nobody, not EVIL."""
        proxies = trust("10.0.0.1/32", header="forwarded")
        value = f'for={TV};by=", for={LAPTOP}'
        assert client_of(proxies, "10.0.0.1", ("Forwarded", value)) == "unknown"

    def test_only_the_header_the_proxies_write_is_read(self) -> None:
        """With x-forwarded-for chosen, a Forwarded header passed through is not believed."""
        proxies = trust("10.0.0.1/32")
        said = (("Forwarded", f"for={TV}"), ("X-Forwarded-For", LAPTOP))
        assert client_of(proxies, "10.0.0.1", *said) == LAPTOP

    def test_a_loopback_peer_forwarding_for_someone_is_not_local(self) -> None:
        """A proxy on this machine that the policy does not name: its clients are not local."""
        proxies = trust()
        assert proxies.client_of("127.0.0.1", CIMultiDict()).is_local
        forwarded = CIMultiDict({"X-Forwarded-For": "127.0.0.1"})
        assert not proxies.client_of("127.0.0.1", forwarded).is_local


# Through the gateway --------------------------------------------------------------------


def household(sim_url: str, extra: str = "") -> str:
    users = f"""\
trusted_proxies: [{PROXY}/32]
users:
  alice: {{keys: [alice-key], admin: true}}
  bob: {{keys: [bob-key]}}
  tv: {{clients: [{TV}/32]}}
{extra}"""
    return one_backend(sim_url, extra=users)


async def get(gateway: Gateway, path: str, peer: str, headers: dict[str, str] | None = None) -> int:
    """GET ``path`` over a connection from ``peer`` (a loopback address of this machine)."""
    connector = aiohttp.TCPConnector(local_addr=(peer, 0))
    async with (
        aiohttp.ClientSession(connector=connector) as session,
        session.get(gateway.url + path, headers=headers or {}) as reply,
    ):
        await reply.read()
        return reply.status


class TestBehindAProxy:
    async def test_spoofed_headers_from_an_untrusted_peer_change_nothing(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A stranger claiming the TV's address in every forwarding header is not the TV:
        401 as without the headers, logged at its own address."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(household(sim_url))
        finished = Finished(gateway)
        spoofed = {"X-Forwarded-For": TV, "Forwarded": f"for={TV}", "X-Real-IP": TV}
        assert await get(gateway, "/api/tags", STRANGER, spoofed) == 401
        record = await finished.first(("/api/tags",))
        assert (str(record.client.address), record.user) == (STRANGER, None)

    async def test_through_a_trusted_proxy_the_forwarded_client_is_identified_and_logged(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The TV behind the proxy is served as tv, and the access log names its address
        and the proxy it came through."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(household(sim_url))
        with structlog.testing.capture_logs() as logs:
            headers = {"X-Forwarded-For": f"10.9.9.9, {TV}"}  # the left one is the TV's say
            assert await get(gateway, "/api/tags", PROXY, headers) == 200
        line = next(entry for entry in logs if entry["event"] == "request")
        assert (line["user"], line["client"], line["proxy"]) == ("tv", TV, PROXY)

    async def test_no_forwarding_header_reaches_the_backend(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The client's claims of where it is are the gateway's to judge: the backend gets
        none of them, trusted proxy or not."""
        sim, sim_url = await start_sim(record_replies=True)
        gateway = await start_gateway(household(sim_url))
        claims = {"X-Forwarded-For": f"10.9.9.9, {TV}", "Forwarded": f"for={TV}", "X-Real-IP": TV}
        chat = {"model": "llama3.2:3b", "messages": [{"role": "user", "content": "hi"}]}
        connector = aiohttp.TCPConnector(local_addr=(PROXY, 0))
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.post(gateway.url + "/api/chat", json=chat, headers=claims) as reply,
        ):
            assert reply.status == 200
            await reply.read()
        sent = sim.request_headers[-1]
        assert not {"X-Forwarded-For", "Forwarded", "X-Real-IP"} & set(sent)

    async def test_the_access_log_names_the_client_without_a_proxy(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Every access log line has the client's address."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(household(sim_url))
        with structlog.testing.capture_logs() as logs:
            assert await get(gateway, "/api/tags", STRANGER, {"X-API-Key": "bob-key"}) == 200
        line = next(entry for entry in logs if entry["event"] == "request")
        assert (line["user"], line["client"]) == ("bob", STRANGER)
        assert "proxy" not in line

    @pytest.mark.parametrize(
        ("peer", "headers", "status"),
        [
            (STRANGER, {}, 200),  # a local client, no proxy
            (PROXY, {"X-Forwarded-For": LAPTOP}, 401),  # a remote client through the proxy
            (PROXY, {"X-Forwarded-For": "127.0.0.1"}, 200),  # a local client through it
            (PROXY, {"X-Forwarded-For": "unknown"}, 401),  # the proxy cannot say
            (STRANGER, {"X-Forwarded-For": "127.0.0.1"}, 401),  # a proxy nobody named
        ],
    )
    async def test_status_is_open_to_this_machine_only_as_the_proxy_reports_it(
        self,
        start_sim: StartSim,
        start_gateway: StartGateway,
        peer: str,
        headers: dict[str, str],
        status: int,
    ) -> None:
        """With the proxy on this machine, /status without a key is refused (no key: 401)
        to remote clients it forwards, and to anything a proxy nobody named forwards."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(household(sim_url))
        assert await get(gateway, "/status", peer, headers) == status

    async def test_an_admin_key_reads_status_through_the_proxy(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The remote admin's key still opens /status; bob's does not."""
        _, sim_url = await start_sim()
        gateway = await start_gateway(household(sim_url))
        forwarded = {"X-Forwarded-For": LAPTOP}
        alice = await get(gateway, "/status", PROXY, {**forwarded, "X-API-Key": "alice-key"})
        bob = await get(gateway, "/status", PROXY, {**forwarded, "X-API-Key": "bob-key"})
        assert (alice, bob) == (200, 403)

    async def test_without_trusted_proxies_the_headers_are_never_read(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """The default: the proxy's header claiming the TV identifies nobody."""
        _, sim_url = await start_sim()
        policy = household(sim_url).replace(f"trusted_proxies: [{PROXY}/32]\n", "")
        gateway = await start_gateway(policy)
        assert await get(gateway, "/api/tags", PROXY, {"X-Forwarded-For": TV}) == 401


def test_a_trusted_proxy_entry_that_is_not_a_range_is_refused_at_its_line() -> None:
    """trusted_proxies takes addresses or CIDR ranges; a host name is refused, with its line."""
    from gateway.config.policy import parse_policy
    from gateway.config.yaml_reader import PolicyError

    text = one_backend("http://127.0.0.1:1", extra="trusted_proxies: [caddy.lan]\n")
    with pytest.raises(PolicyError) as refused:
        parse_policy(text, source="house.yaml")
    assert str(refused.value) == (
        "house.yaml:3: trusted_proxies[0]: 'caddy.lan' is not an IP address or CIDR range"
    )


def test_the_address_helper_maps_ipv4_in_ipv6() -> None:
    """A dual-stack socket's ::ffff:a.b.c.d peer is the IPv4 address (clients: ranges)."""
    from gateway.edge.forwarded import address_of

    assert address_of("::ffff:127.0.0.1") == ip_address("127.0.0.1")
