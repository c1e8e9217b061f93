"""Broken policy files, each with the one sentence it must give, through check-config and reload.

The admin reads these messages while editing the file by hand, so each is checked whole: the
file, the line, the field, and a plain reason (no pydantic internals). A live reload must refuse
exactly what check-config refuses, with the same words, and keep the policy in force.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from multidict import CIMultiDict

from gateway.__main__ import main
from gateway.backends.pool import BackendStates
from gateway.config.policy import load_policy, parse_policy
from gateway.config.yaml_reader import PolicyError
from gateway.edge.identity import Directory
from gateway.reload import LivePolicy

GPU = "backends:\n  - {name: gpu, url: http://127.0.0.1:11434, slots: 2}\n"
ALICE = "users:\n  alice:\n    keys: [alice-key]\n"
MISSING = "FAIRGATE_TEST_UNSET_KEY"


@dataclass(frozen=True)
class Broken:
    why: str
    text: str
    message: str

    def __str__(self) -> str:
        return self.why


BROKEN = [
    Broken(
        "a backend's memory without a unit",
        "backends:\n  - {name: gpu, url: http://127.0.0.1:11434, slots: 2, memory: 24}\n",
        "fairgate.yaml:2: backends[0].memory: a number alone is bytes, too few for a GPU: "
        "give a unit (24GiB) (got 24)",
    ),
    Broken(
        "a key given twice on one line",
        "users:\n  alice: {keys: [k], max_concurrent: 1, max_concurrent: 8}\n" + GPU,
        "fairgate.yaml:2: users.alice: duplicate key 'max_concurrent' (first at line 2)",
    ),
    Broken(
        "a digest whose prefix is in capitals",
        "users:\n  alice:\n    keys: ['SHA256:" + "a" * 64 + "']\n" + GPU,
        "fairgate.yaml:3: users.alice.keys[0]: write the sha256: prefix in lower case",
    ),
    Broken(
        "an escape pasted from a terminal",
        "users:\n  alice:\n    keys: [alice-key]  # \x1b[31m\n" + GPU,
        "fairgate.yaml:3: invalid YAML: the character '\\x1b' is not allowed",
    ),
    Broken(
        "a second users block",
        ALICE + GPU + "users:\n  bob:\n    keys: [bob-key]\n",
        "fairgate.yaml:6: duplicate key 'users' (first at line 1)",
    ),
    Broken(
        "two users of one name",
        ALICE + "  bob:\n    keys: [bob-key]\n  alice:\n    keys: [other-key]\n" + GPU,
        "fairgate.yaml:6: users: duplicate key 'alice' (first at line 2)",
    ),
    Broken(
        "a field given twice in a user",
        ALICE + "    max_queued: 1\n    keys: [other-key]\n" + GPU,
        "fairgate.yaml:5: users.alice: duplicate key 'keys' (first at line 3)",
    ),
    Broken(
        "a user given twice, told with the file's other mistakes",
        "users:\n  alice: {keys: [a-key]}\n  alice: {keys: [b-key]}\nqueue: {max_depth: lots}\n"
        + GPU,
        "fairgate.yaml:3: users: duplicate key 'alice' (first at line 2)\n"
        "fairgate.yaml:4: queue.max_depth: 'lots' is not a whole number",
    ),
    Broken(
        "a field given twice in a backend",
        "backends:\n  - name: gpu\n    url: http://127.0.0.1:11434\n    slots: 2\n    slots: 4\n",
        "fairgate.yaml:5: backends[0]: duplicate key 'slots' (first at line 4)",
    ),
    Broken(
        "a field given twice three levels down",
        "classes:\n  heavy:\n    max_slots: 1\n    max_slots: 50%\n" + GPU,
        "fairgate.yaml:4: classes.heavy: duplicate key 'max_slots' (first at line 3)",
    ),
    Broken(
        "a misspelt limit",
        ALICE + "    max_concurent: 2\n" + GPU,
        "fairgate.yaml:4: users.alice.max_concurent: unknown field; did you mean 'max_concurrent'?",
    ),
    Broken(
        "a misspelt section",
        "user:\n  alice:\n    keys: [alice-key]\n" + GPU,
        "fairgate.yaml:1: user: unknown field; did you mean 'users'?",
    ),
    Broken(
        "a misspelt backend field",
        "backends:\n  - {name: gpu, url: http://127.0.0.1:11434, slot: 2}\n",
        "fairgate.yaml:2: backends[0].slot: unknown field; did you mean 'slots'?",
    ),
    Broken(
        "an unknown field like no known one",
        "queue:\n  colour: blue\n" + GPU,
        "fairgate.yaml:2: queue.colour: unknown field; the fields here are max_depth, max_wait",
    ),
    Broken(
        "a word for a count",
        "defaults:\n  max_concurrent: two\n" + GPU,
        "fairgate.yaml:2: defaults.max_concurrent: 'two' is not a whole number",
    ),
    Broken(
        "a word for a flag",
        ALICE + "    admin: maybe\n" + GPU,
        "fairgate.yaml:4: users.alice.admin: 'maybe' is not true or false",
    ),
    Broken(
        "one key not written as a list",
        "users:\n  alice:\n    keys: alice-key\n" + GPU,
        # Keys are secrets: an error (logged, shown on /status) says what kind, not what.
        "fairgate.yaml:3: users.alice.keys: text (not shown: it holds keys) is not a list; "
        "write it in brackets, as a list",
    ),
    Broken(
        "a section that is not a mapping",
        "timeouts: fast\n" + GPU,
        "fairgate.yaml:1: timeouts: 'fast' is not a mapping (name: value lines)",
    ),
    Broken(
        "a misspelt backend kind",
        "backends:\n  - {name: gpu, url: http://127.0.0.1:11434, slots: 2, kind: olama}\n",
        "fairgate.yaml:2: backends[0].kind: 'olama' is not 'ollama', 'llamacpp', "
        "'llamacpp-router' or 'openai'; did you mean 'ollama'?",
    ),
    Broken(
        "an address that cannot be",
        "users:\n  tv:\n    clients: ['10.0.0.300/24']\n" + GPU,
        "fairgate.yaml:3: users.tv.clients[0]: '10.0.0.300/24' is not an IP address or CIDR range",
    ),
    Broken(
        "a range written from one of its addresses",
        "users:\n  tv:\n    clients:\n      - 192.168.1.50/32\n      - 192.168.1.5/24\n" + GPU,
        "fairgate.yaml:5: users.tv.clients[1]: '192.168.1.5/24' has host bits set; "
        "did you mean '192.168.1.0/24'?",
    ),
    Broken(
        "a duration in words",
        "queue:\n  max_wait: soon\n" + GPU,
        "fairgate.yaml:2: queue.max_wait: 'soon' is not a duration such as 30s, 5m or 1h30m",
    ),
    Broken(
        "a duration with a space",
        GPU + "timeouts:\n  first_byte: 5 minutes\n",
        "fairgate.yaml:4: timeouts.first_byte: '5 minutes' is not a duration such as 30s, 5m "
        "or 1h30m",
    ),
    Broken(
        "a weight too small to divide by",
        ALICE + "    weight: 1.0e-200\n" + GPU,
        "fairgate.yaml:4: users.alice.weight: must be at least 0.001, not 1e-200",
    ),
    Broken(
        "an endless weight",
        GPU + "classes:\n  heavy:\n    weight: .inf\n",
        "fairgate.yaml:5: classes.heavy.weight: must be at most 1000.0, not inf",
    ),
    Broken(
        "a backend with no slots",
        "backends:\n  - {name: gpu, url: http://127.0.0.1:11434, slots: 0}\n",
        "fairgate.yaml:2: backends[0].slots: must be at least 1, not 0",
    ),
    Broken(
        "a heavy share over the whole",
        "classes:\n  heavy:\n    max_slots: 150%\n" + GPU,
        "fairgate.yaml:3: classes.heavy.max_slots: must be a count of slots such as 2, or a "
        "share such as 50% (got '150%')",
    ),
    Broken(
        "a user nobody can be",
        ALICE + "  guest:\n    max_queued: 1\n" + GPU,
        "fairgate.yaml:4: users.guest: no keys and no clients, so no request can ever be this user",
    ),
    Broken(
        "whoever brings no key made an admin",
        ALICE + "  anonymous:\n    admin: true\n" + GPU,
        "fairgate.yaml:5: users.anonymous.admin: anonymous is whoever brings no key: as an "
        "admin, anyone on the network would read /status; give an admin a key of their own",
    ),
    *(
        Broken(
            f"a backend at {url}",
            ALICE + f"backends:\n  - {{name: gpu, url: '{url}', slots: 1}}\n",
            f"fairgate.yaml:5: backends[0].url: '{url}'{said}",
        )
        for url, said in (
            ("http://127.0.0.1:99999", ": the port must be a number from 1 to 65535"),
            ("http://gpu:abc", ": the port must be a number from 1 to 65535"),
            ("http://gpu:0", ": the port must be a number from 1 to 65535"),
            ("http://", " has no host name or address, e.g. http://127.0.0.1:11434"),
            ("http://gpu box:11434", " has a space in it"),
            (
                "http://gpu:11434/v1",
                ": give the server's address alone (the gateway adds /api/... and /v1/...)",
            ),
        )
    ),
    Broken(
        "a user left empty",
        ALICE + "  bob:\n" + GPU,
        "fairgate.yaml:4: users.bob: is empty: give it a value or remove the line",
    ),
    Broken(
        "a key from a variable that is not set",
        ALICE + f"  bob:\n    keys: ['env:{MISSING}']\n" + GPU,
        f"fairgate.yaml:5: users.bob.keys[0]: 'env:{MISSING}' needs {MISSING}, "
        "set neither in the environment nor in .env",
    ),
    Broken(
        "one key given to two users",
        ALICE + "  bob:\n    keys:\n      - bob-key\n      - alice-key\n" + GPU,
        "fairgate.yaml:7: users.bob.keys[1]: alice has this key too (first at line 3)",
    ),
    Broken(
        "one key given to two users, once as its digest",
        ALICE + f"  bob:\n    keys: ['sha256:{hashlib.sha256(b'alice-key').hexdigest()}']\n" + GPU,
        "fairgate.yaml:5: users.bob.keys[0]: alice has this key too (first at line 3)",
    ),
    Broken(
        "a digest that is too short",
        "users:\n  alice:\n    keys: ['sha256:abc']\n" + GPU,
        "fairgate.yaml:3: users.alice.keys[0]: sha256: keys need 64 lowercase hex digits "
        "(sha256sum of the key)",
    ),
    Broken(
        "two backends of one name",
        GPU + "  - {name: gpu, url: http://127.0.0.1:11435, slots: 2}\n",
        "fairgate.yaml:3: backends[1].name: another backend is named 'gpu' (first at line 2)",
    ),
    Broken(
        "an Ollama backend that does not say its parallelism",
        "backends:\n  - name: gpu\n    url: http://127.0.0.1:11434\n",
        "fairgate.yaml:2: backends[0]: an ollama backend needs slots (its OLLAMA_NUM_PARALLEL)",
    ),
    Broken(
        "a backend without its address",
        "backends:\n  - {name: gpu, slots: 2}\n",
        "fairgate.yaml:2: backends[0].url: required, but not given",
    ),
    Broken(
        "no backend at all",
        ALICE,
        "fairgate.yaml:1: backends: required, but not given",
    ),
    Broken(
        "a model's rules under its alias",
        "aliases: {family: llama3.2:3b}\nmodels:\n  family: {num_ctx: {override: 8192}}\n" + GPU,
        "fairgate.yaml:3: models.family: 'family' is an alias: name the model, 'llama3.2:3b'",
    ),
    Broken(
        "a resident model named by its alias",
        "aliases: {family: llama3.2:3b}\nbackends:\n"
        "  - {name: gpu, url: http://127.0.0.1:11434, slots: 2, resident: [family]}\n",
        "fairgate.yaml:3: backends[0].resident[0]: 'family' is an alias: name the model, "
        "'llama3.2:3b'",
    ),
    Broken(
        "a lane rule's model named by its alias",
        "aliases: {embedder: nomic-embed-text}\nlanes:\n  rules:\n"
        "    - lane: background\n      models: [embedder]\n" + GPU,
        "fairgate.yaml:5: lanes.rules[0].models[0]: 'embedder' is an alias: name the model, "
        "'nomic-embed-text'",
    ),
    Broken(
        "two sets of rules for one model",
        "models:\n  llama3.2: {num_ctx: {max: 8192}}\n  llama3.2:latest: {num_ctx: {max: 4096}}\n"
        + GPU,
        "fairgate.yaml:3: models.llama3.2:latest: names the same model as 'llama3.2': give its "
        "rules once (first at line 2)",
    ),
    Broken(
        "a lane rule for a user who does not exist",
        ALICE + "lanes:\n  rules:\n    - {lane: background, users: [alise]}\n" + GPU,
        "fairgate.yaml:6: lanes.rules[0].users[0]: no user is named 'alise'; did you mean 'alice'?",
    ),
    Broken(
        "a lane rule for a user when there are no users",
        "lanes:\n  rules:\n    - {lane: background, users: [agent]}\n" + GPU,
        "fairgate.yaml:3: lanes.rules[0].users[0]: no user is named 'agent': there are no "
        "users, so every request is 'anonymous'",
    ),
    Broken(
        "a lane rule for a person of a user who names nobody",
        ALICE + "lanes:\n  rules:\n    - {lane: background, users: [alice/kid]}\n" + GPU,
        "fairgate.yaml:6: lanes.rules[0].users[0]: 'alice' names no people: only a user with "
        "on_behalf does",
    ),
    Broken(
        "a lane rule's path with a slash at the end",
        "lanes:\n  rules:\n    - lane: background\n      paths: [/api/chat, /api/embed/]\n" + GPU,
        "fairgate.yaml:4: lanes.rules[0].paths[1]: '/api/embed/' is no model's route: did you "
        "mean '/api/embed'? the routes are /api/chat, /api/generate, /api/embed, "
        "/api/embeddings, /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/messages, "
        "/v1/responses",
    ),
    Broken(
        "a lane rule's path without its first slash",
        "lanes:\n  rules:\n    - {lane: background, paths: [api/chat]}\n" + GPU,
        "fairgate.yaml:3: lanes.rules[0].paths[0]: 'api/chat' is no model's route: did you "
        "mean '/api/chat'? the routes are /api/chat, /api/generate, /api/embed, "
        "/api/embeddings, /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/messages, "
        "/v1/responses",
    ),
    Broken(
        "an ollama-only setting on a llama.cpp backend",
        "backends:\n  - {name: gpu, url: http://127.0.0.1:8081, kind: llamacpp, "
        "keep_warm: [qwen]}\n",
        "fairgate.yaml:2: backends[0]: keep_warm: only for an ollama backend",
    ),
    Broken(
        "a lane rule for an empty list of users",
        "lanes:\n  rules:\n    - {lane: background, users: []}\n" + GPU,
        "fairgate.yaml:3: lanes.rules[0].users: an empty list matches no request: leave it "
        "out to match any",
    ),
    Broken(
        "a lane header with spaces",
        "lanes:\n  header: X OWUI Task\n" + GPU,
        "fairgate.yaml:2: lanes.header: 'X OWUI Task' is not a header name: letters, digits "
        "and -, no space or :",
    ),
    Broken(
        "a person named by the header that carries the key",
        "users:\n  owui:\n    keys: [owui-key]\n    on_behalf: {header: Authorization}\n" + GPU,
        "fairgate.yaml:4: users.owui.on_behalf.header: 'Authorization' carries the key: name a "
        "header of its own",
    ),
    Broken(
        "a model's entry with no rules",
        "models:\n  llama3.2: {}\n" + GPU,
        "fairgate.yaml:2: models.llama3.2: gives no rules: give num_ctx, or remove the entry",
    ),
    Broken(
        "a user named no",
        ALICE + "  no:\n    keys: [norah-key]\n" + GPU,
        "fairgate.yaml:4: users: the key no is a yes/no to YAML: write it in quotes, 'no'",
    ),
    Broken(
        "off for a count",
        "defaults:\n  max_queued: off\n" + GPU,
        "fairgate.yaml:2: defaults.max_queued: off is a yes/no to YAML, not a number",
    ),
    Broken(
        "yes for a weight",
        ALICE + "    weight: yes\n" + GPU,
        "fairgate.yaml:4: users.alice.weight: yes is a yes/no to YAML, not a number",
    ),
    Broken(
        "no for a duration",
        "queue:\n  max_wait: no\n" + GPU,
        "fairgate.yaml:2: queue.max_wait: no is a yes/no to YAML, not a number",
    ),
    Broken(
        "on for a share of slots",
        "classes:\n  heavy:\n    max_slots: on\n" + GPU,
        "fairgate.yaml:3: classes.heavy.max_slots: on is a yes/no to YAML, not a number",
    ),
    Broken(
        "off for a size",
        "backends:\n  - {name: gpu, url: http://127.0.0.1:11434, slots: 2, memory: Off}\n",
        "fairgate.yaml:2: backends[0].memory: Off is a yes/no to YAML, not a number",
    ),
    Broken(
        "yes for a num_ctx",
        "num_ctx:\n  override: yes\n" + GPU,
        "fairgate.yaml:2: num_ctx.override: yes is a yes/no to YAML, not a number",
    ),
    Broken(
        "off for a budget",
        "defaults:\n  budget: {tokens_per_day: off}\n" + GPU,
        "fairgate.yaml:2: defaults.budget.tokens_per_day: must be a count such as 50, 500k or "
        "2M, or unlimited (got off)",
    ),
    Broken(
        "a yes/no where text is meant",
        "lanes:\n  header: on\n" + GPU,
        "fairgate.yaml:2: lanes.header: on is a yes/no to YAML, not text (put it in quotes)",
    ),
    Broken(
        "a fraction for a count",
        "defaults:\n  max_concurrent: 1.5\n" + GPU,
        "fairgate.yaml:2: defaults.max_concurrent: 1.5 is not a whole number",
    ),
    Broken(
        "a count with a leading zero",
        "queue:\n  max_depth: 010\n" + GPU,
        "fairgate.yaml:2: queue.max_depth: YAML reads 010 as 8 (octal, for its leading 0): "
        "write 8 if that is meant",
    ),
    Broken(
        "minutes and seconds joined by a colon",
        GPU + "timeouts:\n  idle: 1:30\n",
        "fairgate.yaml:4: timeouts.idle: YAML reads 1:30 as 90 (base 60, for its colons): "
        "write 90 if that is meant",
    ),
    Broken(
        "an endless cost",
        "costs:\n  input: .inf\n" + GPU,
        "fairgate.yaml:2: costs.input: must be a finite number, not inf",
    ),
    Broken(
        "a number for a client's address",
        "users:\n  tv:\n    clients: [10]\n" + GPU,
        "fairgate.yaml:3: users.tv.clients[0]: write an address or CIDR range, such as "
        "192.168.1.50 or 192.168.1.0/24 (got 10)",
    ),
    Broken(
        "a field indented as no block around it is",
        "backends:\n  - name: gpu\n    url: http://127.0.0.1:11434\n   slots: 2\n",
        "fairgate.yaml:4:4: invalid YAML: expected <block end>, but found '<block mapping "
        "start>' (check this line's indentation against the lines above it: YAML nests a "
        "field under the one above it by its spaces, and each level must line up)",
    ),
    Broken(
        "a swap_after that a person's max_wait cuts short",
        "lanes:\n  interactive: {max_wait: 45s}\nbackends:\n"
        "  - {name: box, url: http://127.0.0.1:8080, kind: llamacpp-router, swap_after: 20s}\n",
        "fairgate.yaml:4: backends[0].swap_after: 20s is longer than a person's request waits "
        "for a swap: a third of max_wait (15s), so that the drain and the load still fit "
        "before its 503; raise lanes.interactive.max_wait to 60s, or shorten this",
    ),
    Broken(
        "broken YAML",
        "backends:\n  - name: gpu\n    url: [unclosed\n",
        "fairgate.yaml:4:1: invalid YAML: expected ',' or ']', but got '<stream end>'",
    ),
]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory (no .env) holding the policy file as ``fairgate.yaml``."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(MISSING, raising=False)
    return tmp_path


class TestBrokenPolicies:
    @pytest.mark.parametrize("broken", BROKEN, ids=str)
    def test_check_config_prints_the_one_sentence_and_exits_1(
        self, broken: Broken, workdir: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """fairgate check-config prints exactly the expected message, and only that."""
        (workdir / "fairgate.yaml").write_text(broken.text)
        assert main(["check-config", "fairgate.yaml"]) == 1
        assert capsys.readouterr().err == broken.message + "\n"

    @pytest.mark.parametrize("broken", BROKEN, ids=str)
    def test_a_live_reload_refuses_it_and_keeps_the_old_policy(
        self, broken: Broken, workdir: Path
    ) -> None:
        """A reload of the broken file fails with the same message; the old policy stays."""
        path = Path("fairgate.yaml")
        path.write_text(ALICE + GPU)
        live = LivePolicy(load_policy(path), BackendStates(), path)
        before = live.current
        path.write_text(broken.text)
        assert live.reload() is False
        assert live.current is before
        assert live.last_error == broken.message

    def test_a_file_saved_in_another_encoding_is_refused_at_its_line_and_counted(
        self, workdir: Path
    ) -> None:
        """A comment saved in Latin-1 is not UTF-8: the reload fails with the line, counts
        as failed, and the file is read again once fixed (the watch goes on)."""
        path = Path("fairgate.yaml")
        path.write_text(ALICE + GPU)
        live = LivePolicy(load_policy(path), BackendStates(), path)
        path.write_bytes(b"# Jos\xe9's policy\n" + (ALICE + GPU).encode())
        assert live.reload() is False
        assert live.last_error == "fairgate.yaml:1: not UTF-8 (byte 0xe9): save it as UTF-8"
        assert live.reloads_failed == 1
        path.write_text("# Jose's policy\n" + ALICE + GPU)
        assert live.reload() is True

    def test_the_table_is_large_enough_to_mean_something(self) -> None:
        """The issue asks for at least twenty broken policies; each gives a distinct message."""
        assert len(BROKEN) >= 20
        assert len({broken.message for broken in BROKEN}) == len(BROKEN)

    def test_a_setting_whose_name_is_misspelt_is_named_with_the_one_it_meant(
        self, workdir: Path
    ) -> None:
        """FAIRGATE_LISTN would leave the address at its default without a word:
        check-config (a real process) warns, names the setting it meant, and still passes."""
        (workdir / "fairgate.yaml").write_text(ALICE + GPU)
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "check-config", "fairgate.yaml"],
            capture_output=True,
            text=True,
            env={**os.environ, "FAIRGATE_LISTN": "0.0.0.0:9999"},
        )
        assert done.returncode == 0
        assert (
            "warning: FAIRGATE_LISTN names no setting; did you mean FAIRGATE_LISTEN? "
            "(fine if an env: key reads it)"
        ) in done.stderr

    def test_the_installed_command_gives_the_same_message(self, workdir: Path) -> None:
        """python -m gateway check-config, a real process, prints the message to stderr."""
        broken = BROKEN[1]
        (workdir / "fairgate.yaml").write_text(broken.text)
        done = subprocess.run(
            [sys.executable, "-m", "gateway", "check-config", "fairgate.yaml"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (done.returncode, done.stdout, done.stderr) == (1, "", broken.message + "\n")


class TestKeysFromTheEnvironment:
    def test_a_key_is_read_from_the_dot_env_file(
        self, workdir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """env:NAME finds NAME in ./.env, the file the settings read, and the key then works."""
        monkeypatch.delenv("ALICE_KEY", raising=False)
        (workdir / ".env").write_text("FAIRGATE_LOG_LEVEL=info\nALICE_KEY=from-dot-env\n")
        policy = parse_policy("users:\n  alice:\n    keys: ['env:ALICE_KEY']\n" + GPU)
        directory = Directory(policy)
        caller = directory.identify(CIMultiDict(Authorization="Bearer from-dot-env"), None)
        assert caller.user == "alice"

    def test_the_environment_wins_over_the_dot_env_file(
        self, workdir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """As for the settings, a variable set in the environment overrides ``.env``."""
        monkeypatch.setenv("ALICE_KEY", "from-environment")
        (workdir / ".env").write_text("ALICE_KEY=from-dot-env\n")
        policy = parse_policy("users:\n  alice:\n    keys: ['env:ALICE_KEY']\n" + GPU)
        digest = hashlib.sha256(b"from-environment").hexdigest()
        assert policy.users["alice"].keys == [f"sha256:{digest}"]

    def test_an_empty_variable_is_refused(
        self, workdir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A variable set to nothing would be an empty key; the file is refused at its line."""
        monkeypatch.setenv("ALICE_KEY", "")
        with pytest.raises(PolicyError) as caught:
            parse_policy("users:\n  alice:\n    keys: ['env:ALICE_KEY']\n" + GPU, "f.yaml")
        message = "f.yaml:3: users.alice.keys[0]: 'env:ALICE_KEY' needs ALICE_KEY, which is empty"
        assert str(caught.value) == message

    def test_check_config_reads_systemds_environment_file_when_told(
        self, workdir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An env: key whose variable lives in systemd's EnvironmentFile fails a plain
        check-config and passes with --env-file naming that file."""
        monkeypatch.delenv("ALICE_KEY", raising=False)
        (workdir / "fairgate.yaml").write_text(
            "users:\n  alice:\n    keys: ['env:ALICE_KEY']\n" + GPU
        )
        (workdir / "fairgate.env").write_text("# as under /etc/fairgate\nALICE_KEY=s3cret\n")
        command = [sys.executable, "-m", "gateway", "check-config", "fairgate.yaml"]
        plain = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert plain.returncode == 1 and "ALICE_KEY" in plain.stderr
        told = subprocess.run(
            [*command, "--env-file", "fairgate.env"], capture_output=True, text=True, timeout=60
        )
        assert (told.returncode, told.stdout) == (0, "fairgate.yaml: ok (1 backend(s))\n")


def test_a_policy_path_to_an_endless_file_is_refused_at_a_bound(tmp_path: Path) -> None:
    """A policy path symlinked to /dev/zero is read no further than the bound, and said to
    be no policy: before, the read filled memory (9 GB in 6 s)."""
    endless = tmp_path / "fairgate.yaml"
    endless.symlink_to("/dev/zero")
    with pytest.raises(PolicyError, match=r"over 4 MiB: is it the policy\?"):
        load_policy(endless)
