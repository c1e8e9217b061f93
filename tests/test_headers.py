"""Which headers cross the gateway, to the backend and back (gateway/edge/headers.py)."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy

from gateway.edge.http.headers import decoded, forwarded_headers, returned_pairs


def _proxy(pairs: list[tuple[str, str]]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


class TestForwardedHeaders:
    def test_credentials_and_hop_by_hop_headers_stay_whatever_their_case(self) -> None:
        """Authorization, X-API-Key, cookies, the client's forwarding claims and the headers
        of this hop are dropped however the client spells them; the rest go on in order."""
        client = [
            ("Host", "gateway"),
            ("AUTHORIZATION", "Bearer s3cret"),
            ("x-api-KEY", "s3cret"),
            ("Content-Type", "application/json"),
            ("Cookie", "a=b"),
            ("Connection", "keep-alive, X-Hop"),
            ("x-hop", "for this hop only"),
            ("Accept-Encoding", "gzip"),
            ("User-Agent", "ollama-python/0.4"),
            ("Content-Length", "2"),
            ("X-Forwarded-For", "6.6.6.6"),  # where the client says it is: not the backend's
            ("forwarded", "for=6.6.6.6"),
            ("X-Real-IP", "6.6.6.6"),
        ]
        assert forwarded_headers(_proxy(client)) == [
            ("Content-Type", "application/json"),
            ("User-Agent", "ollama-python/0.4"),
            ("Accept-Encoding", "identity"),
        ]

    def test_the_backend_is_asked_for_an_uncompressed_reply_once(self) -> None:
        """Whatever the client accepts, one Accept-Encoding: identity goes on, last."""
        client = [("Accept-Encoding", "gzip"), ("accept-encoding", "br"), ("Accept", "*/*")]
        forwarded = forwarded_headers(_proxy(client))
        assert forwarded == [("Accept", "*/*"), ("Accept-Encoding", "identity")]

    def test_a_browsers_origin_stays_when_the_gateway_answers_for_cors(self) -> None:
        """Without keep_origin (origins listed in the policy), Origin is dropped however it
        is spelled; with it (the default), it goes on as the client sent it."""
        client = [("ORIGIN", "https://chat.example"), ("Accept", "*/*")]
        assert forwarded_headers(_proxy(client), keep_origin=False) == [
            ("Accept", "*/*"),
            ("Accept-Encoding", "identity"),
        ]
        assert forwarded_headers(_proxy(client)) == [
            ("ORIGIN", "https://chat.example"),
            ("Accept", "*/*"),
            ("Accept-Encoding", "identity"),
        ]


class TestReturnedHeaders:
    def test_hop_by_hop_and_the_backends_own_stay_whatever_their_case(self) -> None:
        """The reply's headers go on as the backend sent them, in its order, without the
        hop-by-hop ones, those its Connection header names, and its Server, Date and
        cookies; a value in UTF-8 goes on as it came, one that is not stays behind."""
        raw = [
            (b"Content-Type", b"application/x-ndjson"),
            (b"connection", b"keep-alive, X-Hop"),
            (b"x-hop", b"1"),
            (b"Keep-Alive", b"timeout=5"),
            (b"Transfer-Encoding", b"chunked"),
            (b"SERVER", b"ollama"),
            (b"Date", b"Wed, 02 Dec 2026 03:00:00 GMT"),
            (b"Set-Cookie", b"a=b"),
            (b"X-Kept", b"caf\xc3\xa9"),
            (b"X-Latin-1", b"caf\xe9"),
        ]
        kept = returned_pairs(raw)
        assert kept == [(b"Content-Type", b"application/x-ndjson"), (b"X-Kept", b"caf\xc3\xa9")]
        assert decoded(kept)[1] == ("X-Kept", "café")
