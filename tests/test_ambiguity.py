"""Bodies that Go's encoding/json reads differently from Python's json: the shared key fold,
the gateway's refusal of ambiguous bodies, and the simulator reading bodies as Ollama does."""

from __future__ import annotations

import json
import string
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairsim.gojson import go_decode
from gateway.wire.ambiguity import (
    AmbiguousField,
    NotAnObject,
    ambiguous_field,
    go_fold,
    load_checked,
)
from gateway.wire.json_counts import MAX_ARRAYS, MAX_VALUES, TooManyValues, count_values
from gateway.wire.json_decode import (
    MAX_OBJECTS,
    NestedTooDeeply,
    TooManyObjects,
    parse_object_pairs,
)
from tests.conftest import StartSim

KELVIN = "\u212a"  # KELVIN SIGN, which Go folds to k
LONG_S = "\u017f"  # LATIN SMALL LETTER LONG S, which Go folds to s


# -- the fold -------------------------------------------------------------------------------


def test_fold_ignores_ascii_case() -> None:
    """ASCII names fold to lower case, so every spelling of a field folds alike."""
    assert go_fold("MODEL") == go_fold("Model") == go_fold("model") == "model"
    assert go_fold("Keep_Alive") == "keep_alive"
    assert go_fold("model") != go_fold("models")
    assert go_fold("_debug_render_only") == "_debug_render_only"


def test_fold_takes_the_kelvin_sign_for_k() -> None:
    """The Kelvin sign folds to k, as Go's unicode.SimpleFold orbit K, k, U+212A has it."""
    assert go_fold(KELVIN) == go_fold("k") == go_fold("K") == "k"
    assert go_fold(KELVIN + "eep_alive") == "keep_alive"


def test_fold_takes_the_long_s_for_s() -> None:
    """The long s folds to s, as Go's orbit S, s, U+017F has it."""
    assert go_fold(LONG_S) == go_fold("s") == go_fold("S") == "s"
    assert go_fold(LONG_S + "ystem") == "system"


@pytest.mark.parametrize(
    "orbit",
    ["\u03c1\u03f1\u03a1", "\u0345\u0399\u03b9\u1fbe", "\u00df\u1e9e", "\u03c2\u03c3\u03a3"],
)
def test_fold_joins_each_of_gos_case_orbits(orbit: str) -> None:
    """Every rune of one of Go's special fold orbits (rho, iota, sharp s, sigma) folds alike."""
    assert len({go_fold(rune) for rune in orbit}) == 1


def test_fold_keeps_the_turkish_i_apart() -> None:
    """Dotted capital I and dotless i fold only to themselves, as Go's SimpleFold tests say."""
    assert go_fold("\u0130") not in {go_fold("i"), go_fold("\u0131")}
    assert go_fold("\u0131") != go_fold("i")


def test_fold_reads_an_unpaired_surrogate_as_the_replacement_character() -> None:
    """A lone surrogate escape folds to U+FFFD, which is what Go's decoder makes of it."""
    assert go_fold("\ud800") == go_fold("\udc00") == "\ufffd"


# -- load_checked ---------------------------------------------------------------------------


def ambiguity_in(body: str | bytes) -> AmbiguousField:
    with pytest.raises(AmbiguousField) as caught:
        load_checked(body.encode() if isinstance(body, str) else body)
    return caught.value


def test_exact_duplicate_model_is_ambiguous() -> None:
    """A key given twice at the top level is refused, though Python's json keeps the last."""
    error = ambiguity_in('{"model": "llama3.2:3b", "model": "qwen2.5:7b"}')
    assert error.path == "model"
    assert error.keys == ("model", "model")


def test_case_variant_model_is_ambiguous() -> None:
    """MODEL next to model is refused, and the message names the field and both spellings."""
    error = ambiguity_in('{"model": "llama3.2:3b", "MODEL": "qwen2.5:7b"}')
    assert error.path == "model"
    assert error.keys == ("model", "MODEL")
    assert '"model", "MODEL"' in str(error)
    assert "ambiguous" in str(error)


def test_kelvin_sign_variant_is_ambiguous() -> None:
    """A key spelt with the Kelvin sign collides with its ASCII spelling."""
    body = '{"keep_alive": "10m", "\\u212aeep_alive": 0}'
    assert ambiguity_in(body).path == "keep_alive"
    assert ambiguity_in(body.replace("\\u212a", KELVIN)).keys == (
        "keep_alive",
        KELVIN + "eep_alive",
    )


def test_duplicates_inside_options_read_as_ollama_reads_them() -> None:
    """Options is a map for Ollama (exact keys, the last duplicate wins), as for Python: an
    exact duplicate gives the last value, a case variant is another (unknown) option."""
    assert load_checked('{"options": {"num_ctx": 2048, "num_ctx": 1}}') == {
        "options": {"num_ctx": 1}
    }
    both = {"options": {"num_ctx": 2048, "Num_Ctx": 1}}
    assert load_checked(json.dumps(both)) == both


def test_duplicates_inside_a_message_are_ambiguous() -> None:
    """A duplicate key in messages[i] is refused and located by index."""
    body = (
        '{"model": "m", "messages": [{"role": "user", "content": "hi"},'
        ' {"role": "user", "content": "a", "Content": "b"}]}'
    )
    assert ambiguity_in(body).path == "messages[1].content"
    exact = '{"messages": [{"role": "user", "role": "system", "content": "x"}]}'
    assert ambiguity_in(exact).path == "messages[0].role"


def test_duplicates_inside_nested_lists_are_ambiguous() -> None:
    """Objects inside lists of lists are checked too."""
    assert ambiguity_in('{"x": [[{"a": 1}], [{"b": 1, "B": 2}]]}').path == "x[1][0].b"
    assert ambiguity_in('[{"ok": 1}, [{"z": 1, "z": 2}]]').path == "[1][0].z"


def test_the_outermost_ambiguity_is_reported_first() -> None:
    """An ambiguous top-level key is reported before one in an earlier nested object."""
    body = '{"messages": [{"a": 1, "A": 2}], "model": "x", "MODEL": "y"}'
    assert ambiguity_in(body).path == "model"


def test_keys_that_are_not_plain_names_are_quoted_in_the_path() -> None:
    """A key with a dot in it is shown in brackets, so the path stays unambiguous itself."""
    assert ambiguity_in('{"a.b": {"c": 1, "C": 2}}').path == '["a.b"].c'


def test_distinct_keys_pass_unchanged() -> None:
    """Keys that differ in more than case pass, and the result equals json.loads's."""
    body = json.dumps(
        {
            "model": "llama3.2:3b",
            "models": ["a"],
            "Model_name": "x",
            "options": {"num_ctx": 2048, "num_predict": 5, "0": 1, "1": 2},
            "messages": [{"role": "user", "content": "hi", "images": ["AAAA"]}],
            "\u0131d": 1,  # dotless i: Go does not fold it to i
            "id": 2,
        }
    ).encode()
    assert load_checked(body) == json.loads(body)


def test_deep_nesting_is_a_value_error_not_a_recursion_error() -> None:
    """100,000 levels of nesting raise NestedTooDeeply, a ValueError, never RecursionError."""
    for body in (b"[" * 100_000, b'{"a":' * 100_000, b"[" * 100_000 + b"]" * 100_000):
        with pytest.raises(NestedTooDeeply, match="nested too deeply"):
            load_checked(body)
        with pytest.raises(ValueError, match="nested too deeply"):
            parse_object_pairs(body)


def test_invalid_json_and_non_objects_are_plain_value_errors() -> None:
    """Malformed JSON and a top-level non-object raise ValueErrors that are not AmbiguousField."""
    for body in (b"{bad", b'{"a": 1', b"\xff\xfe\xfa"):
        with pytest.raises(ValueError) as caught:
            load_checked(body)
        assert not isinstance(caught.value, AmbiguousField)
    with pytest.raises(NotAnObject):
        load_checked(b'["model"]')


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_numbers_gos_decoder_refuses_are_refused(number: str) -> None:
    """Python's json takes NaN and Infinity and makes 1e400 an infinity; Go refuses all of
    them, and int() of an infinity would fail later, in the middle of a policy."""
    with pytest.raises(ValueError, match=r"not a JSON number|out of range"):
        load_checked('{"options": {"num_ctx": ' + number + "}}")
    assert load_checked('{"n": 1e300, "m": -2.5}') == {"n": 1e300, "m": -2.5}


def test_objects_past_the_bound_are_refused() -> None:
    """Each object costs a Python call while parsing: a body may hold MAX_OBJECTS of them
    (the outermost counts), not one more, on each way a body is parsed."""
    assert len(load_checked('{"a": ' + _empties(MAX_OBJECTS - 1) + "}")["a"]) == MAX_OBJECTS - 1
    with pytest.raises(TooManyObjects):
        load_checked('{"a": ' + _empties(MAX_OBJECTS) + "}")
    with pytest.raises(TooManyObjects):  # the exact-duplicate path parses again, bounded too
        load_checked('{"format": {"x": 1, "x": 1, "a": ' + _empties(MAX_OBJECTS) + "}}")


def _empties(count: int) -> str:
    return "[" + ",".join(["{}"] * count) + "]"


def _numbers(count: int) -> bytes:
    """A body of ``count`` values: the object, its array, and the numbers in it."""
    return b'{"context": [' + b",".join([b"7"] * (count - 2)) + b"]}"


def test_values_past_the_bound_are_refused_before_parsing() -> None:
    """A body may hold MAX_VALUES values (the outermost object counts), not one more; the
    refusal says what the limit is."""
    assert len(load_checked(_numbers(MAX_VALUES))["context"]) == MAX_VALUES - 2
    with pytest.raises(TooManyValues, match="more than 1,000,000 JSON values"):
        load_checked(_numbers(MAX_VALUES + 1))


def test_commas_and_brackets_inside_strings_do_not_count() -> None:
    """A prompt of two million commas, brackets, quotes and backslashes is one value; the
    same commas outside strings are two million values."""
    text = 'a, [b], {c}, \\"d\\", \\\\, ' * 200_000
    body = json.dumps({"model": "m", "prompt": text}).encode()
    assert load_checked(body)["prompt"] == text
    with pytest.raises(TooManyValues):
        load_checked(b'{"context": [' + b"1," * 2_000_000 + b"1]}")


def test_arrays_past_their_bound_are_refused() -> None:
    """Arrays cost the garbage collector: MAX_ARRAYS of them (the outer one counts) pass,
    one more is refused, though far fewer values than MAX_VALUES."""
    many = b'{"a": [' + b",".join([b"[]"] * (MAX_ARRAYS - 1)) + b"]}"
    assert len(load_checked(many)["a"]) == MAX_ARRAYS - 1
    with pytest.raises(TooManyValues, match="more than 100,000 JSON arrays"):
        load_checked(many.replace(b"[[]", b"[[],[]"))


def test_nested_arrays_past_their_bound_are_refused_in_a_short_body() -> None:
    """Arrays nested in each other take two bytes each: 100,501 of them in 201 KB are
    counted, and refused, however short the body."""
    nested = "[" * 500 + "]" * 500
    body = '{"a": [' + ",".join([nested] * 201) + "]}"
    assert len(body) < 250_000
    with pytest.raises(TooManyValues, match="more than 100,000 JSON arrays"):
        load_checked(body)


def _counted(value: Any) -> tuple[int, int]:
    """(values, arrays) as count_values counts them: an empty container counts twice."""
    if isinstance(value, list | dict):
        items = list(value.values()) if isinstance(value, dict) else value
        counts = [_counted(item) for item in items]
        values = 1 + sum(v for v, _ in counts) + (not items)
        return values, isinstance(value, list) + sum(a for _, a in counts)
    return 1, 0


_TRICKY = st.text(string.ascii_letters + ',[]{}"\\:/ \n\u00e9\u212a', max_size=6)
_DOCUMENTS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _TRICKY,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(_TRICKY, children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, derandomize=True, database=None)
@given(document=_DOCUMENTS, piece=st.integers(1, 40), indent=st.sampled_from([None, 0, 2]))
def test_counting_agrees_with_the_parser_whatever_the_strings_hold(
    document: Any, piece: int, indent: int | None
) -> None:
    """Counted outside strings, in pieces of any size (so across escapes and quotes), the
    values and arrays are those Python's parser makes."""
    for ascii_only in (True, False):
        body = json.dumps(document, indent=indent, ensure_ascii=ascii_only).encode()
        assert count_values(body, piece) == _counted(document)


def test_ambiguous_field_takes_parsed_pairs_or_plain_dicts() -> None:
    """ambiguous_field finds exact duplicates in parsed pairs, case variants in plain dicts."""
    assert ambiguous_field(parse_object_pairs(b'{"a": {"b": 1, "b": 2}}')) == "a.b"
    assert ambiguous_field({"stream": True, "Stream": False}) == "stream"
    assert ambiguous_field(parse_object_pairs(b'{"a": [{"b": 1}, {"c": 2}]}')) is None


# -- go_decode ------------------------------------------------------------------------------


def test_go_decode_keeps_the_last_of_keys_that_fold_alike() -> None:
    """Struct keys collapse under their lower-case name with the last value, at every depth."""
    body = (
        '{"model": "llama3.2:3b", "MODEL": "qwen2.5:7b", "\\u212aeep_alive": 0,'
        ' "messages": [{"Role": "user", "content": "a", "CONTENT": "b"}]}'
    )
    assert go_decode(body) == {
        "model": "qwen2.5:7b",
        "keep_alive": 0,
        "messages": [{"role": "user", "content": "b"}],
    }


def test_go_decode_keeps_option_names_exact_and_merges_repeated_options() -> None:
    """options is a Go map: its keys stay exact, and a second options adds to the first."""
    body = '{"options": {"num_predict": 3, "NUM_PREDICT": 50}, "Options": {"seed": 1}}'
    assert go_decode(body) == {"options": {"num_predict": 3, "NUM_PREDICT": 50, "seed": 1}}


def test_go_decode_decodes_a_repeated_struct_into_the_first() -> None:
    """A repeated struct field keeps what the later object leaves out, as Go's reuse does."""
    body = '{"stream_options": {"include_usage": true}, "STREAM_OPTIONS": {}}'
    assert go_decode(body) == {"stream_options": {"include_usage": True}}


def test_go_decode_turns_deep_nesting_into_a_value_error() -> None:
    """go_decode raises NestedTooDeeply for 100,000 levels rather than RecursionError."""
    with pytest.raises(NestedTooDeeply):
        go_decode("[" * 100_000)


# -- the simulator --------------------------------------------------------------------------


async def post(url: str, body: str) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, data=body.encode(), headers={"Content-Type": "application/json"}) as r,
    ):
        return r.status, await r.json(content_type=None)


async def test_sim_runs_the_last_case_variant_of_model(start_sim: StartSim) -> None:
    """Sent straight to the simulator, model + MODEL runs the MODEL one, as Ollama would."""
    simulator, url = await start_sim()
    status, reply = await post(
        f"{url}/api/chat",
        '{"model": "llama3.2:3b", "MODEL": "qwen2.5:7b", "stream": false,'
        ' "messages": [{"role": "user", "content": "hi"}]}',
    )
    assert status == 200
    assert reply["model"] == "qwen2.5:7b"
    assert "qwen2.5:7b" in simulator.loaded_models()
    assert "llama3.2:3b" not in simulator.loaded_models()


async def test_sim_openai_route_reads_model_case_insensitively(start_sim: StartSim) -> None:
    """/v1/chat/completions also takes the last case variant of model, as Ollama's does."""
    simulator, url = await start_sim()
    status, reply = await post(
        f"{url}/v1/chat/completions",
        '{"model": "llama3.2:3b", "Model": "qwen2.5:7b",'
        ' "messages": [{"role": "user", "content": "hi"}]}',
    )
    assert status == 200
    assert reply["model"] == "qwen2.5:7b"
    assert list(simulator.loaded_models()) == ["qwen2.5:7b"]


async def test_sim_takes_a_kelvin_sign_keep_alive(start_sim: StartSim) -> None:
    """A keep_alive spelt with the Kelvin sign overrides the ASCII one: 0 unloads at once."""
    simulator, url = await start_sim()
    status, reply = await post(
        f"{url}/api/generate",
        '{"model": "llama3.2:3b", "prompt": "hi", "stream": false,'
        f' "keep_alive": "10m", "{KELVIN}eep_alive": 0}}',
    )
    assert status == 200
    assert reply["done"] is True
    assert simulator.loaded_models() == {}


async def test_sim_keeps_option_names_exact(start_sim: StartSim) -> None:
    """options.NUM_PREDICT is ignored beside num_predict, as Ollama's Options.FromMap does."""
    _, url = await start_sim()
    status, reply = await post(
        f"{url}/api/generate",
        '{"model": "llama3.2:3b", "prompt": "hi", "stream": false,'
        ' "options": {"num_predict": 3, "NUM_PREDICT": 50}}',
    )
    assert status == 200
    assert reply["eval_count"] == 3


async def test_llamacpp_sim_still_reads_keys_exactly(start_sim: StartSim) -> None:
    """llama-server (nlohmann::json) matches keys exactly, so N_PREDICT is not n_predict."""
    _, url = await start_sim(flavor="llamacpp")
    status, reply = await post(
        f"{url}/completion", '{"prompt": "hi", "n_predict": 2, "N_PREDICT": 7, "stream": false}'
    )
    assert status == 200
    assert reply["tokens_predicted"] == 2


def test_keys_ollama_reads_exactly_may_differ_only_in_case() -> None:
    """Inside options, a format schema, tool arguments and schema properties Ollama matches
    keys exactly, so "ID" beside "id" there is two keys, not an ambiguity."""
    schema = {"type": "object", "properties": {"ID": {"type": "string"}, "id": {"type": "string"}}}
    body = {
        "model": "m",
        "format": schema,
        "options": {"num_ctx": 2048, "NUM_CTX": 8192},
        "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
        "messages": [
            {
                "role": "assistant",
                "tool_calls": [{"function": {"name": "f", "arguments": {"A": 1, "a": 2}}}],
            }
        ],
    }
    assert load_checked(json.dumps(body)) == body
    assert load_checked(json.dumps({"model": "m", "Format": schema})) == {
        "model": "m",
        "Format": schema,
    }


def test_the_fields_around_those_maps_are_still_checked() -> None:
    """A case variant of options itself, or of a struct field beside the maps, is refused."""
    with pytest.raises(AmbiguousField) as caught:
        load_checked(b'{"model": "m", "options": {}, "OPTIONS": {"num_ctx": 1}}')
    assert caught.value.path == "options"
    tool = b'{"model": "m", "tools": [{"function": {"name": "f", "NAME": "g"}}]}'
    with pytest.raises(AmbiguousField) as caught:
        load_checked(tool)
    assert caught.value.path == "tools[0].function.name"


def test_a_byte_order_mark_is_refused_in_json_loads_own_words() -> None:
    """A UTF-8 body that starts with a byte order mark is not JSON, as json.loads says."""
    with pytest.raises(json.JSONDecodeError, match="Unexpected UTF-8 BOM"):
        load_checked(b'\xef\xbb\xbf{"model": "llama3.2:3b"}')


@pytest.mark.parametrize(
    "text",
    [
        '{"model": "m"}',
        ' \n\t{"model": "m"} \r\n',
        '{"model": "m"}  x',
        '{"model": "m"}{}',
        "",
        "   ",
        '  ["m"] ',
        "  nope",
        '{"model": "m"',
    ],
)
def test_a_body_reads_as_json_loads_reads_it_around_its_value(text: str) -> None:
    """Blanks before and after the value, extra data and no value at all: the same value,
    or the same error in the same words (at the same place), as json.loads."""
    try:
        expected: object = json.loads(text)
    except json.JSONDecodeError as exc:
        with pytest.raises(json.JSONDecodeError) as caught:
            load_checked(text.encode())
        assert (caught.value.msg, caught.value.pos) == (exc.msg, exc.pos)
        return
    if isinstance(expected, dict):
        assert load_checked(text.encode()) == expected
    else:
        with pytest.raises(NotAnObject):
            load_checked(text.encode())
