"""Ollama's field types, as Go's decoder checks them: the error, or None."""

from __future__ import annotations

import pytest

from gateway.wire.ollama_fields import field_type_error


@pytest.mark.parametrize(
    ("struct", "fields", "error"),
    [
        ("api.GenerateRequest", {"options": "x"}, "cannot unmarshal string into Go struct "
         "field GenerateRequest.options of type map[string]interface {}"),
        ("api.GenerateRequest", {"prompt": 5}, "cannot unmarshal number into Go struct field "
         "GenerateRequest.prompt of type string"),
        ("api.GenerateRequest", {"context": [1, 2.5]}, "cannot unmarshal number 2.5 into Go "
         "struct field GenerateRequest.context of type int"),
        ("api.ChatRequest", {"messages": ["hi"]}, "cannot unmarshal string into Go struct "
         "field ChatRequest.messages of type api.Message"),
        ("api.ChatRequest", {"stream": "yes"}, "cannot unmarshal string into Go struct field "
         "ChatRequest.stream of type bool"),
        ("api.ChatRequest", {"messages": [{"role": "user"}, 0]}, "cannot unmarshal number "
         "into Go struct field ChatRequest.messages of type api.Message"),
        ("api.ChatRequest", {"tools": [False]}, "cannot unmarshal bool into Go struct "
         "field ChatRequest.tools of type api.Tool"),
        ("api.EmbedRequest", {"dimensions": 1.5}, "cannot unmarshal number 1.5 into Go struct "
         "field EmbedRequest.dimensions of type int"),
    ],
)  # fmt: skip
def test_a_field_of_another_type_gets_gos_error(
    struct: str, fields: dict[str, object], error: str
) -> None:
    """The first field Go could not decode, in Go's words."""
    assert field_type_error(struct, fields) == f"json: {error}"


def test_nulls_and_fields_of_the_right_type_pass() -> None:
    """null leaves a Go field as it is; the right types, and fields not checked, pass."""
    fields = {
        "model": "m", "messages": [{"role": "user"}, None], "stream": None, "options": {},
        "tools": [], "format": "json", "keep_alive": 5, "think": "high", "top_logprobs": 3,
    }  # fmt: skip
    assert field_type_error("api.ChatRequest", fields) is None
    assert field_type_error("api.GenerateRequest", {"context": [1, 2], "images": ["aGk="]}) is None


def test_the_first_failing_field_is_named_in_the_structs_order() -> None:
    """With several fields of the wrong type, Go's error names the first of its struct."""
    fields = {"stream": "yes", "messages": "hi", "model": 5}
    assert field_type_error("api.ChatRequest", fields) == (
        "json: cannot unmarshal number into Go struct field ChatRequest.model of type string"
    )
