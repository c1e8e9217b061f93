"""llama-server's ``id_slot``: the slot the gateway chose for a request, written into its body.

llama-server reads ``id_slot`` from a completion's or a chat's body (its OpenAI routes copy
the fields they do not know into its own parameters) and runs the request on that slot,
keeping it until the slot is free. Its JSON reader (nlohmann's) keeps the last of two
equal keys: the gateway's, written at the end of the object, is the one it acts on, whatever
the client wrote before it. (Checked on the pinned server: a body with ``"id_slot":0`` and
then ``"id_slot":1`` ran on slot 1; an ``id_slot`` past its slots runs on a free one.)
Where the gateway does not choose, it writes -1, llama-server's own choice: a client cannot
pin its request to a slot that the gateway's picture of the slots does not know is taken.
"""

from __future__ import annotations

__all__ = ["SLOT_PATHS", "with_slot"]

SLOT_PATHS = frozenset(("/v1/chat/completions", "/v1/completions", "/v1/responses"))
"""The routes whose bodies llama-server reads ``id_slot`` from (the Responses API's too: it
is made into a chat's parameters; seen on the pinned server: a client's ``id_slot`` there
chose its slot). Not /v1/messages, whose conversion leaves it out."""


def with_slot(body: bytes, slot: int | None) -> bytes:
    """``body`` (a JSON object) with ``"id_slot": slot`` as its last member (None: -1,
    llama-server's own choice of slot)."""
    slot = -1 if slot is None else slot
    end = body.rstrip()
    if not end.endswith(b"}"):  # not an object: the parser refused it already
        return body
    inside = end[:-1].rstrip()
    separator = b"" if inside.endswith(b"{") else b","
    return inside + separator + b'"id_slot":' + str(int(slot)).encode() + b"}"
