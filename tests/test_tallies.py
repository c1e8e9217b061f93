"""The tallies at the end of a reply, in each API's shape, found without parsing it whole."""

from __future__ import annotations

import json
from pathlib import Path

from gateway.tallies import TALLY_WINDOW, FinalCounts, final_counts


def _ndjson(*lines: dict[str, object]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def test_ollama_native_final_line() -> None:
    reply = _ndjson(
        {"model": "m", "message": {"role": "assistant", "content": "hi"}, "done": False},
        {"model": "m", "done": True, "load_duration": 2_500_000_000, "prompt_eval_count": 12,
         "eval_count": 34},
    )  # fmt: skip
    assert final_counts(reply) == FinalCounts(12, 34, 2.5)


def test_openai_usage_with_details() -> None:
    sse = (
        b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3,'
        b'"total_tokens":10,"prompt_tokens_details":{"cached_tokens":5}}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert final_counts(sse) == FinalCounts(7, 3)


def test_llamacpp_native_completion() -> None:
    settings = {f"setting_{n}": n for n in range(300)}  # generation_settings run to KiBs
    reply = json.dumps(
        {"content": "hi", "stop": True, "generation_settings": settings,
         "tokens_evaluated": 21, "tokens_predicted": 8}
    ).encode()  # fmt: skip
    assert final_counts(reply) == FinalCounts(21, 8)


def test_counts_after_megabytes_of_embeddings() -> None:
    reply = json.dumps(
        {"model": "embed", "embeddings": [[0.123456789] * 1024] * 64,
         "total_duration": 9, "load_duration": 0, "prompt_eval_count": 640}
    ).encode()  # fmt: skip
    assert len(reply) > 50 * TALLY_WINDOW
    assert final_counts(reply) == FinalCounts(640, None, 0.0)


def test_text_that_mentions_a_tally_is_not_one() -> None:
    reply = _ndjson(
        {"response": 'the JSON was {"eval_count":99, "prompt_tokens": 98}', "done": False},
    )
    assert b'"eval_count":99' in reply.replace(b"\\", b"")
    assert final_counts(reply) == FinalCounts()


def test_no_tallies() -> None:
    assert final_counts(b'{"error":"model not found"}') == FinalCounts()
    assert final_counts(b"") == FinalCounts()


SAMPLES = Path(__file__).parent / "samples" / "llama-server"  # captured from a real server


def test_real_llama_server_replies() -> None:
    assert final_counts((SAMPLES / "chat-nonstream.json").read_bytes()) == FinalCounts(36, 12)
    assert final_counts((SAMPLES / "chat-stream.txt").read_bytes()) == FinalCounts(36, 6)
    completion = (SAMPLES / "completion-stream.txt").read_bytes()
    assert final_counts(completion) == FinalCounts(5, 3)


def test_a_count_no_backend_could_report_is_no_count() -> None:
    """A tally of 10^30 tokens (a broken or hostile backend) is read as none, not written
    into usage where it would overflow the store's 64-bit counts; nor is a fraction."""
    tail = _ndjson({"done": True, "prompt_eval_count": 10**30, "eval_count": 1.5})
    assert final_counts(tail) == FinalCounts(None, None, None)
    tail = _ndjson({"done": True, "prompt_eval_count": 10**14, "eval_count": 7})
    assert final_counts(tail) == FinalCounts(10**14, 7, None)


def test_anthropic_usage_counts_what_the_cache_read_as_prompt_too() -> None:
    """llama-server's whole Messages reply says 1 input token and 30 read from its cache:
    the prompt is 31; Ollama's stream says its counts again in message_delta."""
    whole = (
        b'{"id":"chatcmpl-x","type":"message","content":[{"type":"text","text":"hi"}],'
        b'"usage":{"cache_read_input_tokens":30,"input_tokens":1,"output_tokens":8}}'
    )
    assert final_counts(whole) == FinalCounts(31, 8)
    stream = (
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":'
        b'{"input_tokens":9,"output_tokens":0}}}\n\n'
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":'
        b'"end_turn"},"usage":{"input_tokens":12,"output_tokens":5}}\n\n'
    )
    assert final_counts(stream) == FinalCounts(12, 5)
