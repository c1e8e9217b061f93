"""Whether a stream stopped before its API's end: llama-server's router, whose child died
mid-reply, writes a line of text and closes the stream as if it were done.

OpenAI's chat and completions streams end with ``data: [DONE]``, Anthropic's Messages
stream with its ``message_stop`` event, whichever server sends them (Ollama's, llama-server's
and the others' OpenAI routes alike). Other streams are not judged: Ollama's final line
says ``done`` before its ``context``, which may be larger than any tail kept, and the
Responses API's last event is not the same on every server.
"""

from __future__ import annotations

__all__ = ["STREAM_END_BYTES", "stream_end"]

_ENDS = {
    "/v1/chat/completions": b"data: [DONE]",
    "/v1/completions": b"data: [DONE]",
    "/v1/messages": b'"message_stop"',
}
STREAM_END_BYTES = 256
"""A stream's last bytes that hold its end event, and the blank lines after it, with room
to spare."""


def stream_end(path: str, content_type: str) -> bytes | None:
    """What the last ``STREAM_END_BYTES`` of a reply to ``path`` hold if it ended, when it
    is a stream whose end can be told (None: it is not judged)."""
    if not content_type.startswith("text/event-stream"):
        return None
    return _ENDS.get(path)
