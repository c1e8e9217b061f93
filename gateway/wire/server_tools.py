"""No tool the server runs itself, on Anthropic's Messages API (/v1/messages) and OpenAI's
Responses API (/v1/responses).

Ollama's middlewares (middleware/anthropic.go ``WebSearchAnthropicWriter``, a ``web_search*``
tool; middleware/openai.go ``WebSearchResponsesWriter``, a ``web_search`` tool) answer such
a request by running the search and then further chats of their own (``doFollowUpChat``:
``api.ClientFromEnvironment``, i.e. Ollama itself, up to ``maxWebSearchLoops`` times), past
the gateway: generations that take slots the gateway does not know of, for a request
admitted and charged as one. So such a request is refused, saying so; a client's own tools
(``custom``, ``function``, or no type) pass.
"""

from __future__ import annotations

from gateway.wire.ambiguity import canonical_keys

__all__ = ["server_tools"]

# Anthropic's hasWebSearchTool: strings.HasPrefix(tool.Type, "web_search"); the Responses
# API's isWebSearchTool: tool.Type == "web_search", which the prefix covers.
_SERVER_TOOL = "web_search"


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
