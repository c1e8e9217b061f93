"""What Anthropic's Messages API (/v1/messages) may carry through the gateway: no tool the
server runs itself.

Ollama's middleware (middleware/anthropic.go, ``WebSearchAnthropicWriter``) answers a
request whose ``tools`` hold a ``web_search*`` tool by running the search and then further
chats of its own (``doFollowUpChat``: ``api.ClientFromEnvironment``, i.e. Ollama itself,
up to ``maxWebSearchLoops`` times), past the gateway: generations that take slots the
gateway does not know of, for a request admitted and charged as one. So such a request is
refused, saying so; a client's own tools (``custom``, or no type) pass.
"""

from __future__ import annotations

from gateway.ambiguity import canonical_keys

__all__ = ["server_tools"]

_SERVER_TOOL = "web_search"  # Ollama's hasWebSearchTool: strings.HasPrefix(tool.Type, ...)


def server_tools(values: dict[str, object]) -> str | None:
    """Why the request names a tool the backend would run itself, or None."""
    tools = values.get("tools")
    if not isinstance(tools, list):
        return None
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        kind = (canonical_keys(tool) or tool).get("type")  # its keys as Go reads them
        if isinstance(kind, str) and kind.startswith(_SERVER_TOOL):
            return (
                f"the tool type {kind!r} is run by the server itself, in requests of its own "
                "past this gateway's turns: not available here; give the model your own tools"
            )
    return None
