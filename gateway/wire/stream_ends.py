"""Whether a stream stopped before its API's end: llama-server's router, whose child died
mid-reply, writes a line of text and closes the stream as if it were done.

OpenAI's chat and completions streams end with ``data: [DONE]``, Anthropic's Messages
stream with its ``message_stop`` event, whichever server sends them (Ollama's, llama-server's
and the others' OpenAI routes alike). Other streams are not judged: Ollama's final line
says ``done`` before its ``context``, which may be larger than any tail kept, and the
Responses API's last event is not the same on every server.
"""

from __future__ import annotations

__all__ = ["stream_cut"]

_ENDS = {
    "/v1/chat/completions": b"data: [DONE]",
    "/v1/completions": b"data: [DONE]",
    "/v1/messages": b'"message_stop"',
}
_LAST_BYTES = 256  # the end event and the blank lines after it, with room to spare


def stream_cut(path: str, content_type: str, tail: bytes) -> bool:
    """Whether a server-sent-events reply to ``path`` whose last bytes are ``tail`` ended
    without its API's last event."""
    end = _ENDS.get(path)
    if end is None or not content_type.startswith("text/event-stream"):
        return False
    return end not in tail[-_LAST_BYTES:]
