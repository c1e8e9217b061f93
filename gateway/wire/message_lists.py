"""A chat's ``messages`` (OpenAI's chat completions, Anthropic's Messages): a list of
objects, or no server takes the body.

llama-server refuses any other with a 400 ("Expected 'messages' to be an array"), and
Ollama's Go decoder, whose ``[]Message`` takes neither a number nor a list of strings, does
too; but llama-server's router starts the model's process first (its child reads the
body), so such a body, sent, would unload the model others use for a 400. The gateway
answers it before anything is sent.
"""

from __future__ import annotations

__all__ = ["message_list_error"]


def message_list_error(values: dict[str, object]) -> str | None:
    """Why the body's ``messages`` is not a list of objects, or None (none given is the
    server's to judge)."""
    messages = values.get("messages")
    if messages is None:
        return None
    if not isinstance(messages, list):
        return "messages must be a list of messages"
    if not all(isinstance(message, dict) for message in messages):
        return "each of messages must be an object (a role and its content)"
    return None
