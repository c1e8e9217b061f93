"""The admin's YAML: validation errors point at the line and the field; check-config exits."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel, ValidationError

from gateway.__main__ import main
from gateway.config.base import _remembered_key, model_key
from gateway.config.policy import Policy, load_policy, parse_policy
from gateway.config.yaml_reader import PolicyError

REPO = Path(__file__).resolve().parent.parent

GOOD = """\
backends:
  - name: gpu
    url: http://127.0.0.1:11434
    kind: ollama
    slots: 4
timeouts: {connect: 2s, first_byte: 5m, idle: 90}
"""


def _error_of(text: str) -> str:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, source="house.yaml")
    return str(caught.value)


class TestParsePolicy:
    def test_a_good_file_gives_durations_in_seconds(self) -> None:
        """Durations written as 2s, 5m or a number all become seconds."""
        policy = parse_policy(GOOD)
        assert policy.timeouts.connect == 2.0
        assert policy.timeouts.first_byte == 300.0
        assert policy.timeouts.idle == 90.0
        assert policy.backends[0].slots == 4

    def test_broken_yaml_names_the_file_line_and_column(self) -> None:
        """A YAML syntax error points at the line where parsing failed."""
        message = _error_of("backends:\n  - name: gpu\n    url: [unclosed\n")
        assert message.startswith("house.yaml:4:")
        assert "invalid YAML" in message

    def test_an_unknown_key_names_its_line_and_path(self) -> None:
        """A misspelt key is refused at its own line, with its full path."""
        message = _error_of(GOOD.replace("    slots: 4", "    slot: 4"))
        assert message == "house.yaml:5: backends[0].slot: unknown field; did you mean 'slots'?"

    def test_a_wrong_type_names_its_line_and_value(self) -> None:
        """A value of the wrong type is refused with the value shown."""
        message = _error_of(GOOD.replace("slots: 4", "slots: four"))
        assert "house.yaml:5: backends[0].slots:" in message
        assert "'four'" in message

    def test_a_bad_duration_is_explained(self) -> None:
        """A duration that cannot be read says what a duration looks like."""
        message = _error_of(GOOD.replace("idle: 90", "idle: soon"))
        assert "house.yaml:6: timeouts.idle: 'soon' is not a duration" in message

    def test_an_ollama_backend_without_slots_is_refused(self) -> None:
        """Ollama cannot report its parallelism, so the file must state it."""
        message = _error_of(GOOD.replace("    slots: 4\n", ""))
        assert "house.yaml:2: backends[0]: an ollama backend needs slots" in message

    @pytest.mark.parametrize(("swap_after", "max_wait"), [("1100ms", "3.3s"), ("2.9s", "8.7s")])
    def test_a_swap_after_of_exactly_a_third_of_max_wait_is_taken(
        self, swap_after: str, max_wait: str
    ) -> None:
        """The refusal's own advice passes, however the floats round."""
        text = (
            f"queue: {{max_wait: {max_wait}}}\nbackends:\n  - {{name: box, url: http://box, "
            f"kind: llamacpp-router, swap_after: {swap_after}}}\n"
        )
        assert parse_policy(text).backends[0].swap_after == pytest.approx(float(max_wait[:-1]) / 3)

    def test_duplicate_backend_names_are_refused(self) -> None:
        """Two backends with one name would be indistinguishable in metrics."""
        text = (
            "backends:\n"
            "  - {name: a, url: http://a, slots: 1}\n"
            "  - {name: a, url: http://b, slots: 1}\n"
        )
        message = "house.yaml:3: backends[1].name: another backend is named 'a' (first at line 2)"
        assert _error_of(text) == message

    def test_anonymous_needs_neither_keys_nor_clients(self) -> None:
        """The anonymous user catches requests without a key, so it is reachable as it is."""
        policy = parse_policy("users:\n  anonymous: {max_queued: 0}\n" + GOOD)
        assert policy.users["anonymous"].keys == []

    def test_a_user_named_unknown_is_refused_at_its_line(self) -> None:
        """unknown is what metrics call requests from no known user, so no user may have it."""
        message = _error_of("users:\n  alice: {keys: [a]}\n  unknown: {keys: [u]}\n" + GOOD)
        assert message.startswith("house.yaml:3: users.unknown: metrics count requests")

    def test_a_merge_key_override_is_not_a_duplicate(self) -> None:
        """Overriding a field brought in with YAML's << merge is not a repeated key."""
        text = (
            "users:\n"
            "  alice: &family {keys: [alice-key], max_queued: 4}\n"
            "  bob:\n"
            "    <<: *family\n"
            "    keys: [bob-key]\n" + GOOD
        )
        assert parse_policy(text).users["bob"].keys == ["bob-key"]

    def test_each_problem_gets_its_own_line(self) -> None:
        """Several problems in one file are all reported, one sentence each, in file order."""
        message = _error_of(GOOD.replace("slots: 4", "slots: 0").replace("idle: 90", "idle: x"))
        assert message.splitlines() == [
            "house.yaml:5: backends[0].slots: must be at least 1, not 0",
            "house.yaml:6: timeouts.idle: 'x' is not a duration such as 30s, 5m or 1h30m",
        ]

    def test_a_file_that_is_not_a_mapping_is_refused(self) -> None:
        """A list or a scalar at the top level is not a policy."""
        assert "must be a mapping" in _error_of("- just\n- a list\n")

    def test_a_lane_rule_may_name_anyone_a_request_can_be(self) -> None:
        """A person a front end names, the front end itself, and anonymous in an open
        gateway can each be a request's user: a rule naming them loads."""
        front_end = (
            "users:\n  owui: {keys: [k], on_behalf: {header: X-OpenWebUI-User-Email}}\n"
            "lanes:\n  rules:\n"
            "    - {lane: background, users: [owui, owui/alice@example.com]}\n"
        )
        rules = parse_policy(front_end + GOOD).lanes.rules
        assert rules[0].users == ["owui", "owui/alice@example.com"]
        open_gateway = "lanes:\n  rules:\n    - {lane: background, users: [anonymous]}\n"
        assert parse_policy(open_gateway + GOOD).lanes.rules[0].users == ["anonymous"]


class TestNumbersAsWritten:
    def test_no_field_of_the_policy_takes_a_yes_no_for_anything_but_a_yes_no(self) -> None:
        """off, no, yes and on are booleans to YAML: every field of every section refuses
        one at its own place, unless it is a yes/no itself (admin)."""
        refused_as_numbers = 0
        for model in _sections(Policy, set()):
            for name, field in model.model_fields.items():
                try:
                    model.model_validate({name: False}, context={"environment": {}})
                    errors: list[Any] = []
                except ValidationError as exc:
                    errors = exc.errors()
                about = [e for e in errors if _place(e)[:1] == (name,)]
                assert about or field.annotation is bool, f"{model.__name__}.{name}"
                refused_as_numbers += any(e["type"] == "yes_no_number" for e in about)
        assert refused_as_numbers >= 30  # every count, share, duration, size and weight

    def test_a_number_written_unambiguously_is_read_as_written(self) -> None:
        """A quoted count, a whole number with .0, hexadecimal, underscores and a quoted
        leading zero mean one number each, and are taken."""
        text = (
            "defaults: {max_concurrent: '2', max_queued: 3.0, weight: '1.5'}\n"
            "queue: {max_depth: 0x10, max_wait: '010'}\n"
            "costs: {image_tokens: 1_000}\n"
        )
        policy = parse_policy(text + GOOD)
        assert (policy.defaults.max_concurrent, policy.defaults.max_queued) == (2, 3)
        assert policy.defaults.weight == 1.5
        assert (policy.queue.max_depth, policy.queue.max_wait) == (16, 10.0)
        assert policy.costs.image_tokens == 1000


def _sections(model: type[BaseModel], seen: set[type[BaseModel]]) -> Iterator[type[BaseModel]]:
    """``model`` and every model its fields hold, through lists, mappings and unions."""
    if model in seen:
        return
    seen.add(model)
    yield model
    for field in model.model_fields.values():
        for inner in _types_in(field.annotation):
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                yield from _sections(inner, seen)


def _types_in(annotation: Any) -> Iterator[Any]:
    yield annotation
    for argument in get_args(annotation):
        yield from _types_in(argument)


def _place(error: Any) -> tuple[Any, ...]:
    """Where an error is, below the model validated: its own place, or the one a
    model-wide check names."""
    return (*error["loc"], *(error.get("ctx") or {}).get("at", ()))


class TestCheckConfigCommand:
    def test_the_shipped_example_passes(self, capsys: pytest.CaptureFixture[str]) -> None:
        """deploy/fairgate.example.yaml is a valid policy."""
        assert main(["check-config", str(REPO / "deploy" / "fairgate.example.yaml")]) == 0
        assert ": ok" in capsys.readouterr().out

    def test_a_broken_file_exits_non_zero_with_the_problem(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """check-config prints the field and line of the problem and exits 1."""
        broken = tmp_path / "fairgate.yaml"
        broken.write_text(GOOD.replace("kind: ollama", "kind: vllm"))
        assert main(["check-config", str(broken)]) == 1
        err = capsys.readouterr().err
        assert f"{broken}:4: backends[0].kind:" in err

    def test_a_missing_file_is_reported(self, tmp_path: Path) -> None:
        """A path that does not exist is a PolicyError, not a traceback."""
        with pytest.raises(PolicyError, match="cannot read"):
            load_policy(tmp_path / "absent.yaml")


def test_a_models_list_names_a_model_as_ollama_does() -> None:
    """``phi3`` and ``phi3:latest`` are one model to Ollama, so a list naming either allows
    both; another tag, or an alias to another model, is still not on the list."""
    policy = parse_policy(
        "aliases: {tiny: phi3:latest, big: qwen2.5:7b}\n"
        "users:\n"
        "  kids: {keys: [k], models: [phi3]}\n"
        "  ann: {keys: [a], models: ['llama3.2:latest', tiny]}\n"
        "backends: [{name: gpu, url: 'http://127.0.0.1:11434', kind: ollama, slots: 2}]\n"
    )
    assert policy.may_use("kids", "phi3:latest") and policy.may_use("kids", "phi3")
    assert policy.may_use("kids", "tiny")
    assert not policy.may_use("kids", "phi3:mini") and not policy.may_use("kids", "big")
    assert policy.may_use("ann", "llama3.2") and policy.may_use("ann", "phi3")


@pytest.mark.parametrize(
    ("names", "key"),
    [
        (
            [
                "llama3.2",
                "llama3.2:latest",
                "LLAMA3.2",
                "library/llama3.2",
                "registry.ollama.ai/library/Llama3.2:Latest",
                "https://registry.ollama.ai/library/llama3.2",
            ],
            "llama3.2:latest",
        ),
        (["qwen2.5:7b", "Qwen2.5:7B", "library/qwen2.5:7b"], "qwen2.5:7b"),
        (["hf.co/bartowski/Llama-3.2-1B-GGUF:Q4_K_M"], "hf.co/bartowski/llama-3.2-1b-gguf:q4_k_m"),
        (["me/mine", "registry.ollama.ai/me/mine:latest"], "me/mine:latest"),
        (["localhost:5000/team/model"], "localhost:5000/team/model:latest"),
    ],
)
def test_every_spelling_ollama_runs_as_one_model_has_one_key(names: list[str], key: str) -> None:
    """Ollama fills in the default host, namespace and tag and matches each part in any
    case (types/model/name.go, getExistingName): so does the key every rule is found by."""
    assert {model_key(name) for name in names} == {key}


def test_a_long_model_name_is_not_remembered() -> None:
    """Keys of short names are remembered (each request asks for them a dozen times); a
    client's long name is worked out and forgotten, so names cannot fill memory."""
    before = _remembered_key.cache_info().currsize
    assert model_key("m" * 100_000) == "m" * 100_000 + ":latest"
    assert _remembered_key.cache_info().currsize == before
    model_key("a-model-named-once:7b")
    assert _remembered_key.cache_info().currsize == before + 1
