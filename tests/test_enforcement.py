"""Enforcement as an attacker tries it: bodies Ollama reads differently from the gateway, and
malformed input that must get a 4xx, never a 5xx or a traceback."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import string
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.wire.json_counts import MAX_VALUES
from tests.conftest import Finished, Gateway, StartGateway, StartSim
from tests.test_admission import MODEL, held, idle, queued, until
from tests.test_reload import rewrite

OTHER = "qwen2.5:7b"
KIDS = f"""\
keep_alive: {{min: 5m}}
users:
  kids: {{keys: [kids-key], models: [{MODEL}]}}
"""
HEADERS = {"Authorization": "Bearer kids-key"}
GENERATION = {
    "/api/generate": {"model": MODEL, "prompt": "hi"},
    "/api/chat": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
    "/api/embed": {"model": MODEL, "input": "hi"},
}


async def start(start_sim: StartSim, start_gateway: StartGateway) -> tuple[Any, Gateway]:
    sim, url = await start_sim(models=[MODEL, OTHER], decode_tokens_per_s=100000.0)
    backend = f"backends:\n  - {{name: sim, url: {url}, kind: ollama, slots: 2}}\n"
    return sim, await start_gateway(KIDS + backend)


async def post(gateway: Gateway, path: str, body: bytes) -> tuple[int, str]:
    headers = {**HEADERS, "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        # A BytesIO, which aiohttp sends in pieces: a body of megabytes as bytes it would
        # write in one call (and warn that this holds the loop).
        session.post(gateway.url + path, data=io.BytesIO(body), headers=headers) as reply,
    ):
        return reply.status, await reply.text()


class TestAmbiguousBodies:
    @pytest.mark.parametrize(
        ("path", "spelling"),
        [("/api/generate", "MODEL"), ("/api/chat", "Model"), ("/v1/chat/completions", "mODEL")],
    )
    async def test_a_second_model_key_in_another_case_is_refused(
        self, start_sim: StartSim, start_gateway: StartGateway, path: str, spelling: str
    ) -> None:
        """The allow-list saw llama3.2:3b; Ollama (and now the simulator) would run qwen: 400."""
        sim, gateway = await start(start_sim, start_gateway)
        body = {**GENERATION[path], "stream": False}
        text = json.dumps(body)[:-1] + f', "{spelling}": "{OTHER}"}}'
        status, reply = await post(gateway, path, text.encode())
        assert status == 400 and "more than once" in reply
        assert OTHER not in sim.loaded_models()

    async def test_a_second_keep_alive_in_another_case_is_refused(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """keep_alive 0 hidden behind KEEP_ALIVE would unload the model under a 5m minimum."""
        sim, gateway = await start(start_sim, start_gateway)
        text = f'{{"model": "{MODEL}", "prompt": "hi", "stream": false, '
        text += '"keep_alive": "10m", "KEEP_ALIVE": 0}'
        status, _ = await post(gateway, "/api/generate", text.encode())
        assert status == 400
        assert not sim.loaded_models()  # nothing ran, so nothing was loaded or unloaded

    async def test_a_lone_keep_alive_in_another_case_is_still_clamped(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """KEEP_ALIVE alone is keep_alive to Ollama: the 5m minimum applies, the model stays."""
        sim, gateway = await start(start_sim, start_gateway)
        text = f'{{"model": "{MODEL}", "prompt": "hi", "stream": false, "KEEP_ALIVE": 0}}'
        status, _ = await post(gateway, "/api/generate", text.encode())
        assert status == 200
        assert MODEL in sim.loaded_models()

    async def test_exact_duplicate_keys_are_refused_too(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Parsers disagree on exact duplicates (first, last or error): refused as well."""
        _, gateway = await start(start_sim, start_gateway)
        text = f'{{"model": "{MODEL}", "model": "{OTHER}", "prompt": "hi"}}'
        status, _ = await post(gateway, "/api/generate", text.encode())
        assert status == 400


class TestMalformedInput:
    @pytest.mark.parametrize(
        "body",
        [
            {"model": MODEL, "messages": 5},
            {"model": MODEL, "messages": True},
            {"model": MODEL, "prompt": "hi", "images": 5},
            {"model": MODEL, "messages": [{"role": "user", "content": "hi", "images": 7}]},
            {"model": MODEL, "prompt": "hi", "keep_alive": int("9" * 400)},
            {"model": MODEL, "prompt": 5, "system": ["a", 1]},
        ],
    )
    async def test_wrongly_typed_fields_get_a_4xx(
        self, start_sim: StartSim, start_gateway: StartGateway, body: dict[str, Any]
    ) -> None:
        """A field of the wrong type is the client's error, never a 500 from the gateway (the
        backend answers it in its own words; the simulator is more lenient than Ollama)."""
        _, gateway = await start(start_sim, start_gateway)
        path = "/api/chat" if "messages" in body else "/api/generate"
        status, _ = await post(gateway, path, json.dumps({**body, "stream": False}).encode())
        assert status < 500

    @pytest.mark.parametrize(
        ("path", "options", "error"),
        [
            ("/api/chat", {"main_gpu": True}, 'option "main_gpu" must be of type integer'),
            (
                "/api/generate",
                {"temperature": "0.2"},
                'option "temperature" must be of type float32',
            ),
            ("/api/embed", {"use_mmap": 1}, 'option "use_mmap" must be of type boolean'),
            ("/api/embeddings", {"stop": [1]}, 'option "stop" must be of an array of strings'),
        ],
    )
    async def test_an_option_of_the_wrong_type_gets_ollamas_words_in_a_400(
        self,
        start_sim: StartSim,
        start_gateway: StartGateway,
        path: str,
        options: dict[str, Any],
        error: str,
    ) -> None:
        """Ollama reads options when it schedules the request and answers a wrong type with
        a 500; the gateway refuses it first, in Ollama's words, and nothing is loaded."""
        sim, gateway = await start(start_sim, start_gateway)
        body = {**GENERATION.get(path, {"model": MODEL, "prompt": "hi"}), "options": options}
        status, reply = await post(gateway, path, json.dumps({**body, "stream": False}).encode())
        assert (status, json.loads(reply)["error"]) == (400, error)
        assert not sim.loaded_models()

    async def test_a_keep_alive_string_longer_than_any_duration_is_refused_unparsed(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A keep_alive of 32,768 "1s" parts is parsed on the event loop in time that grows
        with its square (half a MiB held every stream 1.7 s, a 32 MiB one would for hours):
        refused with a 400 that says why, nothing forwarded."""
        sim, gateway = await start(start_sim, start_gateway)
        body = {"model": MODEL, "prompt": "hi", "stream": False, "keep_alive": "1s" * 32_768}
        status, reply = await post(gateway, "/api/generate", json.dumps(body).encode())
        assert status == 400 and "keep_alive" in reply, reply
        assert not sim.loaded_models()

    async def test_deep_nesting_gets_a_400(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """100,000 nested arrays exhaust Python's parser: a 400, not a RecursionError's 500."""
        _, gateway = await start(start_sim, start_gateway)
        body = f'{{"model": "{MODEL}", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
        status, _ = await post(gateway, "/api/generate", body.encode())
        assert status == 400

    async def test_a_key_that_is_not_utf8_gets_401(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """79 bytes with a non-UTF-8 byte in the Bearer key: 401, not a 500 and a traceback."""
        _, gateway = await start(start_sim, start_gateway)
        host, port = gateway.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /api/chat HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n"
            b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
        )
        status_line = await reader.readline()
        writer.close()
        await writer.wait_closed()
        assert status_line.split()[1] == b"401"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(string.ascii_letters + "_", max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)
FIELDS = ("model", "prompt", "messages", "images", "options", "keep_alive", "stream", "format")


def generated_requests(count: int) -> list[tuple[str, dict[str, Any]]]:
    """``count`` generated (path, body) pairs; collected first, then sent on one loop."""
    requests: list[tuple[str, dict[str, Any]]] = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        path=st.sampled_from(sorted(GENERATION)),
        fields=st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=5),
        model_kept=st.booleans(),
    )
    def collect(path: str, fields: dict[str, Any], model_kept: bool) -> None:
        body = {**fields, "stream": False}
        if model_kept:
            body["model"] = MODEL
        requests.append((path, body))

    collect()
    return requests


async def test_generated_bodies_never_get_a_5xx(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """Two thousand bodies of every shape on every generation path: each answer is < 500."""
    _, gateway = await start(start_sim, start_gateway)
    failures = []
    for path, body in generated_requests(2000):
        status, text = await post(gateway, path, json.dumps(body).encode())
        if status >= 500:
            failures.append((path, body, status, text))
    assert not failures, failures[:5]


@pytest.mark.parametrize("kind", [["image_url"], {"a": 1}])
async def test_a_content_part_whose_type_is_no_string_is_no_5xx(
    start_sim: StartSim, start_gateway: StartGateway, kind: object
) -> None:
    """A part's ``type`` a list or an object (no part type, and unhashable): the gateway's
    count and prompt blocks read past it, and the backend answers what it makes of it."""
    _, gateway = await start(start_sim, start_gateway)
    for path in ("/v1/chat/completions", "/api/chat"):
        part = {"type": kind, "text": "hi"}
        body = {"model": MODEL, "stream": False, "messages": [{"role": "user", "content": [part]}]}
        status, text = await post(gateway, path, json.dumps(body).encode())
        assert status < 500, (path, status, text)


class TestBodiesGoReadsOtherwise:
    @pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
    async def test_a_num_ctx_go_cannot_read_is_a_400_not_a_500(
        self, start_sim: StartSim, start_gateway: StartGateway, number: str
    ) -> None:
        """NaN, Infinity and numbers beyond float64 are valid to Python, not to Ollama:
        a clear 400 before any policy tries to read them as a context size."""
        _, gateway = await start(start_sim, start_gateway)
        body = f'{{"model": "{MODEL}", "prompt": "hi", "options": {{"num_ctx": {number}}}}}'
        status, text = await post(gateway, "/api/generate", body.encode())
        assert status == 400, text
        assert "not valid JSON" in json.loads(text)["error"]

    async def test_half_an_emoji_in_a_rewritten_body_is_relayed(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A lone surrogate escape (an emoji cut in half by a JavaScript client) in a body the
        keep_alive policy rewrites: relayed, as Go reads it, instead of a 500."""
        _, gateway = await start(start_sim, start_gateway)
        body = (
            b'{"model": "%s", "prompt": "hi \\ud83d", "stream": false, "keep_alive": "1m"}'
            % MODEL.encode()
        )
        status, text = await post(gateway, "/api/generate", body)
        assert status == 200, text

    async def test_a_body_of_countless_objects_is_refused(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """Every JSON object costs the parser a call on the event loop: past the bound, a
        400 that says why, instead of seconds of every stream held."""
        _, gateway = await start(start_sim, start_gateway)
        objects = "[" + ",".join(["{}"] * 150_000) + "]"
        body = f'{{"model": "{MODEL}", "prompt": "x", "format": {{"a": {objects}}}}}'
        status, text = await post(gateway, "/api/generate", body.encode())
        assert status == 400, text
        assert "more than 100,000 JSON objects" in json.loads(text)["error"]

    async def test_a_body_of_a_million_values_is_the_most_that_passes(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A context of token ids may make the body a million values (the object, its four
        fields and the numbers); one more is a 400 that says the limit, before parsing."""
        _, gateway = await start(start_sim, start_gateway)
        head = f'{{"model": "{MODEL}", "prompt": "x", "stream": false, "context": ['.encode()
        numbers = b",".join([b"7"] * (MAX_VALUES - 5))
        status, text = await post(gateway, "/api/generate", head + numbers + b"]}")
        assert status == 200, text
        status, text = await post(gateway, "/api/generate", head + numbers + b",7]}")
        assert status == 400, text
        assert "more than 1,000,000 JSON values" in json.loads(text)["error"]

    async def test_commas_in_a_message_are_not_values(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """A message of two million commas passes (a string is one value, whatever it
        holds); the same commas between numbers are refused."""
        _, gateway = await start(start_sim, start_gateway)
        message = {"role": "user", "content": "1, " * 2_000_000}
        chat = {"model": MODEL, "messages": [message], "stream": False}
        status, text = await post(gateway, "/api/chat", json.dumps(chat).encode())
        assert status == 200, text
        numbers = {"model": MODEL, "prompt": "x", "stream": False, "context": [1] * 2_000_000}
        status, text = await post(gateway, "/api/generate", json.dumps(numbers).encode())
        assert status == 400, text
        assert "more than 1,000,000 JSON values" in json.loads(text)["error"]

    @pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16", "utf-32"])
    async def test_a_body_in_another_encoding_than_utf8_is_refused_before_it_is_parsed(
        self, start_sim: StartSim, start_gateway: StartGateway, encoding: str
    ) -> None:
        """Go reads UTF-8 only; Python's parser guesses UTF-16 and UTF-32 too, where a
        character (U+0122 is the bytes 22 01 in UTF-16) looks like a quote to the count of
        values. Such a body of more than a million values is a 400 that no backend sees."""
        _, gateway = await start(start_sim, start_gateway)
        finished = Finished(gateway)
        numbers = ",".join(["7"] * MAX_VALUES)
        text = f'{{"model": "{MODEL}", "prompt": "\u0122", "context": [{numbers}]}}'
        status, reply = await post(gateway, "/api/generate", text.encode(encoding))
        assert status == 400, reply
        assert "not valid JSON" in json.loads(reply)["error"]
        assert (await finished.first(("/api/generate",))).backend is None

    @pytest.mark.parametrize("size", [10, 100_000], ids=["small body", "big body"])
    async def test_a_fraction_among_token_ids_gets_gos_error_whatever_the_body_size(
        self, start_sim: StartSim, start_gateway: StartGateway, size: int
    ) -> None:
        """Go's own 400 for a context that is not all integers, from the gateway before any
        backend sees it, whether the body was parsed on the event loop or, being big, in the
        parser's thread."""
        _, gateway = await start(start_sim, start_gateway)
        finished = Finished(gateway)
        body = {"model": MODEL, "prompt": "x", "stream": False, "context": [7] * size + [2.5]}
        status, text = await post(gateway, "/api/generate", json.dumps(body).encode())
        assert status == 400, text
        assert json.loads(text)["error"] == (
            "json: cannot unmarshal number 2.5 into Go struct field GenerateRequest.context "
            "of type int"
        )
        assert (await finished.first(("/api/generate",))).backend is None

    @pytest.mark.parametrize(
        ("fields", "field"),
        [
            ({"context": [7] * 10 + [2**63]}, "context"),
            ({"context": [7] * 100_000 + [-(2**63) - 1]}, "context"),
            ({"context": [7, None, 2**64]}, "context"),
            ({"top_logprobs": 2**63}, "top_logprobs"),
        ],
        ids=["small body", "big body", "a null among them", "a field of its own"],
    )
    async def test_an_integer_beyond_gos_int_gets_gos_error(
        self, start_sim: StartSim, start_gateway: StartGateway, fields: dict[str, Any], field: str
    ) -> None:
        """Go's int is 64 bits: a token id or a count beyond it is Go's own 400, from the
        gateway before any backend sees it (sent on, it could cost a swap for nothing)."""
        _, gateway = await start(start_sim, start_gateway)
        finished = Finished(gateway)
        body = {"model": MODEL, "prompt": "x", "stream": False, **fields}
        status, text = await post(gateway, "/api/generate", json.dumps(body).encode())
        assert status == 400, text
        error = json.loads(text)["error"]
        assert error.startswith("json: cannot unmarshal number "), error
        assert error.endswith(f" into Go struct field GenerateRequest.{field} of type int")
        assert (await finished.first(("/api/generate",))).backend is None


class TestReadsUnderPolicy:
    async def test_a_limited_user_sees_only_their_models_and_cannot_show_others(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """kids (only llama3.2:3b) list only it in /api/tags and /v1/models; /api/show of
        qwen is 403, of their own model 200."""
        _, gateway = await start(start_sim, start_gateway)
        async with aiohttp.ClientSession(headers=HEADERS) as session:
            async with session.get(gateway.url + "/api/tags") as reply:
                names = [entry["name"] for entry in (await reply.json())["models"]]
            async with session.get(gateway.url + "/v1/models") as reply:
                ids = [entry["id"] for entry in (await reply.json())["data"]]
            async with session.post(gateway.url + "/api/show", json={"model": OTHER}) as reply:
                forbidden = reply.status
            async with session.post(gateway.url + "/api/show", json={"model": MODEL}) as reply:
                allowed = reply.status
        assert names == [MODEL] and ids == [MODEL]
        assert (forbidden, allowed) == (403, 200)


class TestRevocation:
    async def test_a_reload_that_removes_a_key_refuses_its_waiting_requests_at_once(
        self, start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
    ) -> None:
        """A waiting request whose key left the policy gets 401 key_revoked, not a late turn."""
        _, url = await start_sim()
        path = tmp_path / "fairgate.yaml"
        path.write_text(revocable_policy(url, "[alice-key, alice-old]"))
        gateway = await start_gateway(path, reload_interval=0.05)
        admission = gateway.services.admission
        async with held(gateway, "alice-key", "one"):
            waiting_old = asyncio.create_task(generate_reply(gateway, "alice-old"))
            waiting_kept = asyncio.create_task(generate_reply(gateway, "alice-key"))
            await until(admission, queued("alice", 2))
            await rewrite(gateway, path, revocable_policy(url, "[alice-key]"))
            status, body = await asyncio.wait_for(waiting_old, timeout=2)
            assert (status, json.loads(body)["error"]) == (401, ANY_REVOKED)
            assert admission.snapshot().users["alice"] == (1, 1)  # the kept key still waits
        assert (await asyncio.wait_for(waiting_kept, timeout=5))[0] == 200
        await until(admission, idle)

    async def test_a_reload_that_removes_a_user_refuses_their_waiting_requests(
        self, start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
    ) -> None:
        """Taking a user out of the file ends their waiting requests; others are untouched."""
        _, url = await start_sim()
        path = tmp_path / "fairgate.yaml"
        path.write_text(revocable_policy(url, "[alice-key]", bob=True))
        gateway = await start_gateway(path, reload_interval=0.05)
        admission = gateway.services.admission
        async with held(gateway, "bob-key", "one"):
            waiting = asyncio.create_task(generate_reply(gateway, "bob-key"))
            await until(admission, queued("bob", 1))
            await rewrite(gateway, path, revocable_policy(url, "[alice-key]"))
            assert (await asyncio.wait_for(waiting, timeout=2))[0] == 401
        await until(admission, idle)

    async def test_a_revoked_keys_background_request_is_refused_too(
        self, start_sim: StartSim, start_gateway: StartGateway, tmp_path: Path
    ) -> None:
        """Background work (a title, a follow-up) waits in its own lane: a key taken out of
        the policy ends it there as well, rather than letting it run later."""
        _, url = await start_sim()
        path = tmp_path / "fairgate.yaml"
        lanes = "lanes: {header: X-Task}\n"
        path.write_text(lanes + revocable_policy(url, "[alice-key, alice-old]", slots=1))
        gateway = await start_gateway(path, reload_interval=0.05)
        admission = gateway.services.admission
        async with held(gateway, "alice-key", "one"):
            task = asyncio.create_task(generate_reply(gateway, "alice-old", {"X-Task": "title"}))
            await until(admission, lambda room: room.background_users == {"alice": (0, 1)})
            await rewrite(gateway, path, lanes + revocable_policy(url, "[alice-key]", slots=1))
            status, body = await asyncio.wait_for(task, timeout=2)
            assert (status, json.loads(body)["error"]) == (401, ANY_REVOKED)
        await until(admission, idle)


ANY_REVOKED = "this key or user was removed from the policy while the request waited"


def revocable_policy(url: str, alice_keys: str, bob: bool = False, slots: int = 4) -> str:
    bob_line = "  bob: {keys: [bob-key]}\n" if bob else ""
    return (
        "defaults: {max_concurrent: 1, max_queued: 4}\n"
        f"users:\n  alice: {{keys: {alice_keys}}}\n{bob_line}"
        f"backends:\n  - {{name: sim, url: {url}, kind: ollama, slots: {slots}}}\n"
    )


async def generate_reply(
    gateway: Gateway, key: str, more_headers: dict[str, str] | None = None
) -> tuple[int, str]:
    body = json.dumps({"model": MODEL, "prompt": "hi", "stream": False}).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    headers.update(more_headers or {})
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + "/api/generate", data=body, headers=headers) as reply,
    ):
        return reply.status, await reply.text()


HEADER_NAMES = (
    "Authorization", "X-API-Key", "Expect", "Content-Encoding", "Connection", "X-Request-Id",
    "Content-Type", "Transfer-Encoding", "Accept", "Accept-Encoding", "X-Fairgate-Lane",
)  # fmt: skip
# What a header value may hold on the wire (visible ASCII, space, tab, and obs-text bytes).
HEADER_VALUES = st.text(
    alphabet=st.characters(codec="latin-1", exclude_categories=("Cc",)) | st.sampled_from("\t "),
    max_size=40,
) | st.sampled_from(
    ["Bearer kids-key", "100-continue", "gzip", "deflate", "br", "chunked", "close", "x, y"]
)


CHAT_BODY = json.dumps({"model": MODEL, "prompt": "hi", "stream": False}).encode()


def generated_heads(count: int) -> list[tuple[str, list[tuple[str, str]], bytes]]:
    """``count`` generated (path, headers, body) triples for raw requests."""
    heads: list[tuple[str, list[tuple[str, str]], bytes]] = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None)
    @given(
        path=st.sampled_from(sorted(GENERATION)),
        headers=st.lists(st.tuples(st.sampled_from(HEADER_NAMES), HEADER_VALUES), max_size=6),
        body=st.sampled_from([b"", b"{", CHAT_BODY, gzip.compress(CHAT_BODY), b"\x1f\x8b"]),
        keyed=st.integers(0, 3),
    )
    def collect(path: str, headers: list[tuple[str, str]], body: bytes, keyed: int) -> None:
        # Mostly with the key, so that most requests get past identification.
        key = [("Authorization", "Bearer kids-key")] if keyed else []
        heads.append((path, key + headers, body))

    collect()
    return heads


async def raw_status(
    gateway: Gateway, path: str, headers: list[tuple[str, str]], body: bytes
) -> int:
    """The status of one raw HTTP/1.1 request (its own connection), or 0 if closed unanswered."""
    host, _, port = gateway.url.removeprefix("http://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
    head = f"POST {path} HTTP/1.1\r\nHost: g\r\nContent-Length: {len(body)}\r\n{lines}\r\n"
    writer.write(head.encode("latin-1") + body)
    try:
        status_line = await asyncio.wait_for(reader.readline(), timeout=10)
    finally:
        writer.close()
    return int(status_line.split()[1]) if status_line else 0


async def test_generated_headers_never_get_a_5xx_or_a_traceback(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """A thousand requests with generated headers (keys, expectations, encodings, hop-by-hop
    lists, request ids) on every generation path: each answer < 500, no error logged."""
    _, gateway = await start(start_sim, start_gateway)
    failures = []
    with structlog.testing.capture_logs() as logs:
        for path, headers, body in generated_heads(1000):
            status = await raw_status(gateway, path, headers, body)
            if status >= 500:
                failures.append((path, headers, body, status))
    assert not failures, [(*f[:2], f[3]) for f in failures[:5]]
    assert not [entry for entry in logs if entry["log_level"] in ("error", "critical")]


class TestChatBodiesNoServerTakes:
    async def test_a_body_no_reading_takes_is_refused_and_one_go_takes_is_sent(
        self, start_sim: StartSim, start_gateway: StartGateway
    ) -> None:
        """messages: 5 no server takes (a router would start the model first): the gateway's
        400, nothing sent. ``Messages`` and ``Role`` Ollama's Go decoder reads as
        ``messages`` and ``role``: sent, as without the gateway."""
        sim, gateway = await start(start_sim, start_gateway)
        path, hi = "/v1/chat/completions", {"role": "user", "content": "hi"}
        status, text = await post(
            gateway, path, json.dumps({"model": MODEL, "messages": 5}).encode()
        )
        assert status == 400 and "messages must be a list of messages" in text
        assert sim.stats.prompts == []
        for body in ({"Messages": [hi]}, {"messages": [{"Role": "user", "content": "hi"}]}):
            status, text = await post(gateway, path, json.dumps({"model": MODEL, **body}).encode())
            assert status == 200, (body, text)


class TestOneCompletionARequest:
    @pytest.mark.parametrize(
        ("path", "body"),
        [
            ("/v1/chat/completions", {**GENERATION["/v1/chat/completions"], "n": 2}),
            ("/v1/completions", {"model": MODEL, "prompt": "one", "n_cmpl": 4}),
            ("/v1/completions", {"model": MODEL, "prompt": ["one", "two"]}),
            ("/v1/completions", {"model": MODEL, "prompt": [[1, 2], [3, 4]]}),
            ("/v1/chat/completions", {**GENERATION["/v1/chat/completions"], "n": 2.0}),
            ("/v1/completions", {"model": MODEL, "prompt": "one", "n_cmpl": 2.5}),
        ],
        ids=[
            "n over 1",
            "llama.cpp's n_cmpl over 1",
            "two prompts",
            "two prompts of token ids",
            "n 2.0, which llama.cpp reads as 2",
            "n_cmpl 2.5, which llama.cpp cuts to 2",
        ],
    )
    async def test_a_request_for_several_completions_is_refused(
        self, start_sim: StartSim, start_gateway: StartGateway, path: str, body: object
    ) -> None:
        """llama.cpp runs each completion on a slot of its own and counts one in its usage:
        one request, one slot, or a 400 that says to send one request for each."""
        sim, gateway = await start(start_sim, start_gateway)
        status, text = await post(gateway, path, json.dumps(body).encode())
        assert status == 400 and "one request for each" in text
        assert sim.stats.prompts == []

    @pytest.mark.parametrize(
        "prompt", [[1, 2, 3], ["one"], "one"], ids=["token ids", "a list of one", "a string"]
    )
    async def test_one_prompt_in_any_of_its_shapes_is_taken(
        self, start_sim: StartSim, start_gateway: StartGateway, prompt: object
    ) -> None:
        """A prompt of token ids, or a list that holds one prompt, is one completion."""
        _, gateway = await start(start_sim, start_gateway)
        body = {"model": MODEL, "prompt": prompt, "n": 1, "max_tokens": 2}
        status, text = await post(gateway, "/v1/completions", json.dumps(body).encode())
        assert status == 200, text
