"""A chat's ``messages`` (OpenAI's chat completions, Anthropic's Messages) as every server
demands them, and a reply's length as a number: bodies no server takes, answered
before anything is sent.

llama-server refuses them with a 400 ("Expected 'messages' to be an array", "type must be
number"), and Ollama's Go decoder, whose ``[]Message`` and ``*int`` take neither, does too
(a length of 2.5 llama-server takes, Ollama not: that is Ollama's to refuse);
but llama-server's router starts the model's process first (its child reads the body), so
such a body, sent, would unload the model others use for the refusal. What only a server
can judge (a tool without its function, an image to a model that reads none) is left to
it, and the swap bar (``swaps/bar.py``) keeps its sender from doing it twice.
"""

from __future__ import annotations

from gateway.wire.ambiguity import canonical_keys

__all__ = ["message_list_error"]

_CHATS = frozenset({"/v1/chat/completions", "/v1/messages"})
_LENGTHS = ("max_tokens", "max_completion_tokens")


def message_list_error(path: str, values: dict[str, object]) -> str | None:
    """Why the body of a request to ``path`` is one no server takes, or None. Read as
    llama-server reads it (its keys exactly) and as Ollama's Go decoder does (blind to
    case): refused only if neither takes it (``Messages`` is Ollama's ``messages``)."""
    said = _error(path, values, fold=False)
    return said if said is not None and _error(path, values, fold=True) is not None else None


def _error(path: str, values: dict[str, object], fold: bool) -> str | None:
    if fold:
        values = canonical_keys(values) or values
    for name in _LENGTHS:
        length = values.get(name)
        if length is not None and (isinstance(length, bool) or not isinstance(length, int | float)):
            return f"{name} must be a number of tokens"
    messages = values.get("messages")
    if messages is None:
        return "messages is required: a list of messages" if path in _CHATS else None
    if not isinstance(messages, list):
        return "messages must be a list of messages"
    for message in messages:
        if not isinstance(message, dict):
            return "each of messages must be an object (a role and its content)"
        if fold:
            message = canonical_keys(message) or message
        if not isinstance(message.get("role"), str):
            return "each message's role must be a string"
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            return "a message's content must be a string or a list of parts"
    return None
