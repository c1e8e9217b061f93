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

__all__ = ["openai_refusal", "server_tools", "several_completions"]

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


# What the OpenAI routes take: one completion a request, and no tool the server runs.
#
# A chat or completion that asks for several (``n`` or llama.cpp's ``n_cmpl`` over 1, or a
# list of prompts) is run by llama.cpp on a slot for each, and its usage counts one of them,
# where the gateway admits, and charges, one request for one slot. Ollama makes one
# completion whatever ``n`` says and refuses a list of prompts. So the gateway refuses them,
# with a message saying what to do.


def openai_refusal(values: dict[str, object]) -> str | None:
    """Why an OpenAI route's request is not taken here (several completions, a tool the
    server would run itself: /v1/responses' web_search), or None."""
    return several_completions(values) or server_tools(values)


def several_completions(values: dict[str, object]) -> str | None:
    """Why the request asks for more than one completion, or None. A prompt of token ids is
    one prompt; a list holding one prompt is one too."""
    # llama.cpp reads n_cmpl too, of which n is its alias (server's params_from_json), as
    # an int from any JSON number: nlohmann's get<int> cuts 2.0 and 2.5 to 2.
    for name in ("n", "n_cmpl"):
        count = values.get(name)
        if isinstance(count, int | float) and not isinstance(count, bool) and count >= 2:
            return f"{name} must be 1 here: send one request for each completion"
    prompt = values.get("prompt")
    if isinstance(prompt, list) and len(prompt) > 1 and not _token_ids(prompt):
        return "prompt must be one prompt here: send one request for each"
    return None


def _token_ids(prompt: list[object]) -> bool:
    return all(isinstance(item, int) and not isinstance(item, bool) for item in prompt)
