"""The relay's own HTTP/1.1 client, against raw loopback servers that answer as written."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest
from multidict import CIMultiDict

from gateway.relay.upstream_client import BackendClient
from gateway.relay.upstream_connection import BackendClosed, MalformedReply
from gateway.relay.upstream_reply import Reply
from tests.raw_backend import raw_backend


@pytest.fixture
async def client() -> AsyncIterator[BackendClient]:
    client = BackendClient(limit=8)
    yield client
    await client.close()


def _chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


_STREAM_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"


async def _body(reply: Reply) -> bytes:
    async with reply:
        return await reply.read_up_to(1 << 20)


async def _post(
    client: BackendClient, url: str, close: bool = False, headers: Any = None, **options: Any
) -> Reply:
    """A chat's POST to the backend at ``url``; ``options``: the client's own keywords."""
    sent = CIMultiDict({"Content-Type": "application/json"}) if headers is None else headers
    return await client.request(
        "POST",
        url + "/api/chat",
        sent,
        b"{}",
        connect_timeout=5,
        first_byte=5,
        close=close,
        **options,
    )


class TestReplies:
    async def test_a_chunked_reply_arrives_byte_for_byte(self, client: BackendClient) -> None:
        """The de-chunked body is the bytes the backend framed, whatever the chunking."""
        lines = [b'{"n":%d}\n' % n for n in range(50)]

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(_STREAM_HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
            for line in lines:  # split mid-line too: boundaries carry no meaning
                writer.write(_chunked(line[:3], line[3:])[: -len(b"0\r\n\r\n")])
                await writer.drain()
            writer.write(b"0\r\n\r\n")

        async with raw_backend(answer) as backend:
            reply = await _post(client, backend.url)
            assert reply.status == 200 and reply.content_length is None
            assert await _body(reply) == b"".join(lines)

    async def test_a_sink_is_told_which_bytes_end_the_body_and_no_failure_comes_after(
        self, client: BackendClient
    ) -> None:
        """The bytes that came with the end reach the sink marked last (the relay sends its
        end with them); a failure after that (a shutdown's interrupt) fails nothing."""
        go_on = asyncio.Event()

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(_STREAM_HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\none\r\n")
            await writer.drain()
            await go_on.wait()
            writer.write(b"3\r\ntwo\r\n5\r\nthree\r\n0\r\n\r\n")

        async with raw_backend(answer) as backend:
            reply = await _post(client, backend.url)
            async with reply:
                assert await reply.first() == b"one"
                passed: list[tuple[bytes, bool]] = []
                reply.pass_to(lambda data, last: passed.append((data, last)))
                go_on.set()
                assert await reply.passed()
                assert b"".join(data for data, _ in passed) == b"twothree"
                assert [last for _, last in passed] == [False] * (len(passed) - 1) + [True]
                reply.set_exception(TimeoutError())
                assert await reply.passed()

    async def test_a_body_without_a_length_ends_with_the_connection(
        self, client: BackendClient
    ) -> None:
        """No Content-Length and no chunking: the body is everything up to the close."""

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(_STREAM_HEAD + b"Connection: close\r\n\r\n" + b'{"a":1}\n{"b":2}\n')
            await writer.drain()
            writer.close()

        async with raw_backend(answer) as backend:
            assert await _body(await _post(client, backend.url)) == b'{"a":1}\n{"b":2}\n'

    async def test_a_reply_cut_short_fails_after_its_bytes(self, client: BackendClient) -> None:
        """A close inside a declared length: the bytes sent are read, then BackendClosed."""

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n" + b"partial")
            await writer.drain()
            writer.close()

        async with raw_backend(answer) as backend:
            reply = await _post(client, backend.url)
            async with reply:
                assert reply.content_length == 100
                received = b""
                with pytest.raises(BackendClosed):
                    while more := await reply.read():
                        received += more
                assert received == b"partial"

    async def test_a_reply_to_head_ends_with_its_head(self, client: BackendClient) -> None:
        """A HEAD reply's Content-Length describes a body that never comes."""

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n")

        async with raw_backend(answer) as backend:
            reply = await client.request(
                "HEAD",
                backend.url + "/api/version",
                CIMultiDict(),
                None,
                connect_timeout=5,
                first_byte=5,
            )
            assert reply.status == 200
            assert await asyncio.wait_for(_body(reply), timeout=5) == b""

    async def test_the_first_byte_deadline_runs_until_the_first_body_bytes(
        self, client: BackendClient
    ) -> None:
        """A head on time is not enough: no body byte within first_byte is a TimeoutError."""

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(_STREAM_HEAD + b"Transfer-Encoding: chunked\r\n\r\n")

        async with raw_backend(answer) as backend:
            headers = CIMultiDict({"Content-Type": "application/json"})
            url = backend.url + "/api/chat"
            reply = await client.request(
                "POST", url, headers, b"{}", connect_timeout=5, first_byte=0.2
            )
            async with reply:
                with pytest.raises(TimeoutError):
                    await reply.first()

    async def test_a_head_with_its_first_bytes_is_handed_over_before_the_caller_wakes(
        self, client: BackendClient
    ) -> None:
        """The head and the first bytes of one read go to ``arrived`` from the connection's
        callback, with the reply the request then returns; a head read alone does not, and
        its first bytes are read as ever."""
        go_on, rest = asyncio.Event(), asyncio.Event()

        async def answer(request: bytes, writer: asyncio.StreamWriter) -> None:
            head = _STREAM_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
            if b"/alone" in request:
                writer.write(head)
                await writer.drain()
                await go_on.wait()
                writer.write(b"5\r\nfirst\r\n")
            else:
                writer.write(head + b"5\r\nfirst\r\n")
                await writer.drain()
                await rest.wait()
            writer.write(b"4\r\nrest\r\n0\r\n\r\n")

        async with raw_backend(answer) as backend:
            arrived: list[tuple[Reply, bytes | None]] = []

            def took(reply: Reply) -> None:
                arrived.append((reply, reply.first_if_here()))

            headers = CIMultiDict({"Content-Type": "application/json"})
            reply = await _post(client, backend.url, headers=headers, arrived=took)
            assert arrived == [(reply, b"first")]
            rest.set()
            assert await _body(reply) == b"rest"

            alone = await client.request(
                "POST",
                backend.url + "/alone",
                headers,
                b"{}",
                connect_timeout=5,
                first_byte=5,
                arrived=took,
            )
            go_on.set()
            assert await _body(alone) == b"firstrest"
            assert len(arrived) == 1  # not told of the second: its head came alone


class TestConnections:
    async def test_replies_in_a_row_share_one_keep_alive_connection(
        self, client: BackendClient
    ) -> None:
        """A complete reply gives its connection back for the next request."""

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(_STREAM_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(b"x\n"))

        async with raw_backend(answer) as backend:
            for _ in range(3):
                assert await _body(await _post(client, backend.url)) == b"x\n"
            assert backend.connections == 1 and len(backend.requests) == 3

    async def test_a_reply_asked_to_close_is_not_reused(self, client: BackendClient) -> None:
        """close=True (llama-server, which hangs up after a stream whatever it promised):
        each request gets a new connection."""

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(_STREAM_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + _chunked(b"x\n"))

        async with raw_backend(answer) as backend:
            for _ in range(2):
                assert await _body(await _post(client, backend.url, close=True)) == b"x\n"
            assert backend.connections == 2

    async def test_bytes_after_a_reply_spoil_its_connection(self, client: BackendClient) -> None:
        """What follows a complete reply is not taken as the next request's reply."""

        async def answer(request: bytes, writer: asyncio.StreamWriter) -> None:
            extra = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale"
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + extra)

        async with raw_backend(answer) as backend:
            assert await _body(await _post(client, backend.url)) == b"ok"
            assert await _body(await _post(client, backend.url)) == b"ok"
            assert backend.connections == 2

    async def test_the_pool_opens_no_more_than_its_limit(self) -> None:
        """At the limit, a request waits for a connection to be given back, then uses it."""

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

        client = BackendClient(limit=1)
        async with raw_backend(answer) as backend:
            first = await _post(client, backend.url)
            second = asyncio.create_task(_post(client, backend.url))
            await asyncio.sleep(0)  # the second runs up to its wait: it does no I/O before
            assert client.waiting == 1 and backend.connections == 1
            assert await _body(first) == b"ok"
            assert await _body(await second) == b"ok"
            assert backend.connections == 1 and client.waiting == 0
        await client.close()


class TestHostileBackends:
    async def test_an_endless_head_is_cut_at_64_kib(self, client: BackendClient) -> None:
        """A backend that never ends its headers gets MalformedReply, not our memory."""

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\n")
            for n in range(1_000):
                writer.write(b"X-Filler-%d: %s\r\n" % (n, b"y" * 100))
                await writer.drain()
            writer.write(b"Content-Length: 2\r\n\r\nok")

        async with raw_backend(answer) as backend:
            with pytest.raises(MalformedReply, match="64 KiB"):
                await _post(client, backend.url)

    async def test_a_head_over_64_kib_written_at_once_is_cut_as_well(
        self, client: BackendClient
    ) -> None:
        """The same head of ~110 KiB, its end and its body in one write: read in one go, it
        meets the same bound as one that dribbles in."""
        filler = b"".join(b"X-Filler-%d: %s\r\n" % (n, b"y" * 100) for n in range(1_000))

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\n" + filler + b"Content-Length: 2\r\n\r\nok")

        async with raw_backend(answer) as backend:
            with pytest.raises(MalformedReply, match="head is over 64 KiB"):
                await _post(client, backend.url)

    async def test_a_long_reply_sent_with_its_head_in_one_write_is_not_taken_for_a_head(
        self, client: BackendClient
    ) -> None:
        """A non-streamed reply of 1 MiB (embeddings, a long context) arriving with its head
        in one read is a short head and a long body."""
        body = b"[" + b"0.5," * (256 * 1024) + b"0]"

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))

        async with raw_backend(answer) as backend:
            assert await _body(await _post(client, backend.url)) == body

    async def test_a_header_with_a_line_break_is_never_sent(self, client: BackendClient) -> None:
        """A CR or LF inside a header value cannot smuggle a header or a request."""

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

        async with raw_backend(answer) as backend:
            headers = CIMultiDict({"X-Note": "a\r\nX-Admin: yes"})
            with pytest.raises(ValueError, match="line break"):
                await _post(client, backend.url, headers=headers)
            assert backend.requests == []

    async def test_header_pairs_go_out_as_given_and_their_type_is_found_in_any_case(
        self, client: BackendClient
    ) -> None:
        """The relay's pairs are written in their order and spelling; a Content-Type among
        them, however spelled, is the body's, with no default beside it."""

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

        pairs = [("content-TYPE", "application/json"), ("X-Trace", "t"), ("X-Trace", "u")]
        async with raw_backend(answer) as backend:
            reply = await client.request(
                "POST", backend.url + "/api/chat", pairs, b"{}", connect_timeout=5, first_byte=5
            )
            assert await _body(reply) == b"ok"
        head = backend.requests[0].split(b"\r\n\r\n")[0].split(b"\r\n")
        assert head[2:] == [
            b"content-TYPE: application/json",
            b"X-Trace: t",
            b"X-Trace: u",
            b"Content-Length: 2",
        ]

    async def test_a_header_pair_with_a_line_break_is_never_sent(
        self, client: BackendClient
    ) -> None:
        """As in a CIMultiDict, a CR or LF in a pair's name or value sends nothing."""

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

        async with raw_backend(answer) as backend:
            for pair in [("X-Note", "a\nX-Admin: yes"), ("X-Admin: yes\r\nX-Note", "a")]:
                with pytest.raises(ValueError, match="line break"):
                    url = backend.url + "/api/chat"
                    await client.request(
                        "POST", url, [pair], b"{}", connect_timeout=5, first_byte=5
                    )
            assert backend.requests == []

    async def test_not_http_is_a_malformed_reply(self, client: BackendClient) -> None:
        """Bytes that are not an HTTP reply fail the request with MalformedReply."""

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(b"SSH-2.0-OpenSSH_9.6\r\n")

        async with raw_backend(answer) as backend:
            with pytest.raises(MalformedReply):
                await _post(client, backend.url)

    async def test_a_switch_of_protocols_is_a_malformed_reply(self, client: BackendClient) -> None:
        """A 101 answers no request of ours: MalformedReply, not a hang to the deadline."""

        async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n")
            writer.write(b"Connection: upgrade\r\n\r\nraw bytes")

        async with raw_backend(answer) as backend:
            with pytest.raises(MalformedReply, match="switched"):
                await asyncio.wait_for(_post(client, backend.url), timeout=4)


async def test_credentials_in_a_backends_url_go_as_basic_auth(client: BackendClient) -> None:
    """An Ollama behind an authenticating proxy, written http://user:p%40ss@host: each
    request carries those credentials, and the Host header does not."""

    async def answer(_: bytes, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    async with raw_backend(answer) as backend:
        url = backend.url.replace("http://", "http://user:p%40ss@")
        assert await _body(await _post(client, url)) == b"ok"
    head = backend.requests[0].split(b"\r\n\r\n")[0].split(b"\r\n")
    assert b"Authorization: Basic " + base64.b64encode(b"user:p@ss") in head
    assert b"Host: " + backend.url.removeprefix("http://").encode() in head
