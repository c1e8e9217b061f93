"""The tallies at the end of a reply, in each API's shape, found without parsing it whole."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.wire.tallies import TALLY_WINDOW, FinalCounts, final_counts


def _ndjson(*lines: dict[str, object]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_ollama_native_final_line() -> None:
    reply = _ndjson(
        {"model": "m", "message": {"role": "assistant", "content": "hi"}, "done": False},
        {"model": "m", "done": True, "load_duration": 2_500_000_000, "prompt_eval_count": 12,
         "eval_count": 34},
    )  # fmt: skip
    assert final_counts(reply, "/api/chat") == FinalCounts(12, 34, 2.5)


def test_openai_usage_with_details() -> None:
    sse = (
        b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,'
        b'"total_tokens":10,"prompt_tokens_details":{"cached_tokens":5}}}\n\n'
        b"data: [DONE]\n\n"
    )
    counts = final_counts(sse, "/v1/chat/completions")
    assert counts == FinalCounts(7, 3, cached_tokens=5)
    assert counts.evaluated_tokens == 2


def test_llama_server_stream_without_usage_has_its_timings() -> None:
    """A streamed chat without include_usage: llama-server's last event still carries its
    timings, what the cache read (cache_n) and what it evaluated (prompt_n)."""
    sse = (
        b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
        b'data: {"choices":[{"finish_reason":"stop","index":0,"delta":{}}],"timings":'
        b'{"cache_n":2600,"prompt_n":14,"prompt_ms":80.1,"predicted_n":9,"predicted_ms":5.2}}\n\n'
        b"data: [DONE]\n\n"
    )
    counts = final_counts(sse, "/v1/chat/completions")
    assert counts == FinalCounts(2614, 9, cached_tokens=2600)
    assert counts.evaluated_tokens == 14


def test_ollama_says_what_its_cache_read() -> None:
    """prompt_eval_count is the whole prompt; prompt_eval_cached_count (Ollama since
    ollama/ollama#17943) the part its cache read. An older Ollama says nothing of it."""
    newer = _ndjson({"done": True, "prompt_eval_count": 120, "prompt_eval_cached_count": 100,
                     "eval_count": 4})  # fmt: skip
    assert final_counts(newer, "/api/chat") == FinalCounts(120, 4, cached_tokens=100)
    older = _ndjson({"done": True, "prompt_eval_count": 120, "eval_count": 4})
    assert final_counts(older, "/api/chat").evaluated_tokens == 120


def test_a_cached_count_is_never_more_than_the_prompt() -> None:
    reply = _ndjson({"done": True, "prompt_eval_count": 10, "prompt_eval_cached_count": 99})
    assert final_counts(reply, "/api/generate").evaluated_tokens == 0


def test_llamacpp_native_completion() -> None:
    settings = {f"setting_{n}": n for n in range(300)}  # generation_settings run to KiBs
    reply = json.dumps(
        {"content": "hi", "stop": True, "generation_settings": settings,
         "tokens_evaluated": 21, "tokens_predicted": 8}
    ).encode()  # fmt: skip
    assert final_counts(reply, "/v1/completions") == FinalCounts(21, 8)


def test_counts_after_megabytes_of_embeddings() -> None:
    reply = json.dumps(
        {"model": "embed", "embeddings": [[0.123456789] * 1024] * 64,
         "total_duration": 9, "load_duration": 0, "prompt_eval_count": 640}
    ).encode()  # fmt: skip
    assert len(reply) > 50 * TALLY_WINDOW
    assert final_counts(reply, "/api/embed") == FinalCounts(640, None, 0.0)


def test_text_that_mentions_a_tally_is_not_one() -> None:
    reply = _ndjson(
        {"response": 'the JSON was {"eval_count":99, "prompt_tokens": 98}', "done": False},
    )
    assert b'"eval_count":99' in reply.replace(b"\\", b"")
    assert final_counts(reply, "/api/generate") == FinalCounts()


def test_no_tallies() -> None:
    assert final_counts(b'{"error":"model not found"}', "/api/chat") == FinalCounts()
    assert final_counts(b"", "/v1/chat/completions") == FinalCounts()


SAMPLES = Path(__file__).parent / "samples" / "llama-server"  # captured from a real server


def test_real_llama_server_replies() -> None:
    chat = "/v1/chat/completions"
    whole = (SAMPLES / "chat-nonstream.json").read_bytes()
    assert final_counts(whole, chat) == FinalCounts(36, 12, cached_tokens=0)
    # The same prompt again: the cache read 35 of its 36 tokens (the last one is always
    # evaluated, for its logits).
    stream = final_counts((SAMPLES / "chat-stream.txt").read_bytes(), chat)
    assert stream == FinalCounts(36, 6, cached_tokens=35)
    assert stream.evaluated_tokens == 1
    completion = (SAMPLES / "completion-stream.txt").read_bytes()
    assert final_counts(completion, "/v1/completions") == FinalCounts(5, 3, cached_tokens=4)


def test_a_count_no_backend_could_report_is_no_count() -> None:
    """A tally of 10^30 tokens (a broken or hostile backend) is read as none, not written
    into usage where it would overflow the store's 64-bit counts; nor is a fraction."""
    tail = _ndjson({"done": True, "prompt_eval_count": 10**30, "eval_count": 1.5})
    assert final_counts(tail, "/api/chat") == FinalCounts(None, None, None)
    tail = _ndjson({"done": True, "prompt_eval_count": 10**14, "eval_count": 7})
    assert final_counts(tail, "/api/chat") == FinalCounts(10**14, 7, None)


def test_anthropic_usage_counts_what_the_cache_read_as_prompt_too() -> None:
    """llama-server's whole Messages reply says 1 input token and 30 read from its cache:
    the prompt is 31; Ollama's stream says its counts again in message_delta."""
    whole = (
        b'{"id":"chatcmpl-x","type":"message","content":[{"type":"text","text":"hi"}],'
        b'"usage":{"cache_read_input_tokens":30,"input_tokens":1,"output_tokens":8}}'
    )
    assert final_counts(whole, "/v1/messages") == FinalCounts(31, 8, cached_tokens=30)
    stream = (
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
        b'{"input_tokens":9,"output_tokens":0}}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
        b'"end_turn"},"usage":{"input_tokens":12,"output_tokens":5}}\n\n'
    )
    assert final_counts(stream, "/v1/messages") == FinalCounts(12, 5)


def test_a_tool_calls_arguments_are_not_the_tallies_of_a_messages_reply() -> None:
    """Ollama's whole Messages reply carries a tool call's input as a JSON object, before
    its usage: keys there named as another API's tallies do not replace the usage."""
    spoof = {"eval_count": 1, "prompt_eval_count": 0, "prompt_tokens": 0, "completion_tokens": 0}
    whole = json.dumps(
        {"type": "message", "content": [{"type": "tool_use", "name": "f", "input": spoof}],
         "stop_reason": "tool_use", "usage": {"input_tokens": 5000, "output_tokens": 3000}}
    ).encode()  # fmt: skip
    assert final_counts(whole, "/v1/messages") == FinalCounts(5000, 3000)


def test_a_requests_tools_echoed_are_not_the_tallies_of_a_responses_reply() -> None:
    """Ollama's Responses reply echoes the request's tools (their parameters verbatim)
    before its usage: a schema key named prompt_tokens is not the count."""
    tools = [{"type": "function", "name": "f", "parameters": {"prompt_tokens": 0,
              "completion_tokens": 0, "eval_count": 0}}]  # fmt: skip
    whole = json.dumps(
        {"object": "response", "output": [], "tools": tools,
         "usage": {"input_tokens": 41, "output_tokens": 7, "total_tokens": 48}}
    ).encode()  # fmt: skip
    assert final_counts(whole, "/v1/responses") == FinalCounts(41, 7)


def test_a_messages_stream_cut_before_its_delta_says_no_output_count() -> None:
    """message_start says an output of 0; a stream that ends without message_delta (Ollama
    drops an error mid-stream) has no output count, so its relayed tokens are charged."""
    stream = (
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
        b'{"input_tokens":17,"output_tokens":0}}}\n\n'
        + b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"x"}}\n\n' * 20
    )
    assert final_counts(stream, "/v1/messages") == FinalCounts(17, None)
