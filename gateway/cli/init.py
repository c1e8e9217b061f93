"""``fairgate init``: a first policy in a minute, from the server it will front.

It asks the local Ollama or llama-server what it serves (its models; llama-server also its
slots), takes the household's people (from ``--person``, else asked), makes each a fresh
key, and writes a commented ``fairgate.yaml``: the keys as ``sha256:`` digests, the plain
keys printed once and nowhere else. The file is checked by the policy's own parser before
it is written, so what it writes is a policy the gateway serves. It never overwrites a
file without ``--force``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.cli.keys import new_key
from gateway.cli.status import local_gateway
from gateway.config import ANONYMOUS, UNKNOWN, hashed_key, load_policy

__all__ = ["add_init_arguments"]

_CANDIDATES = ("http://127.0.0.1:11434", "http://127.0.0.1:8080")  # Ollama's, llama-server's
_TIMEOUT = 3.0  # seconds for each question to the server: it is local, or it is not there
_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
_FRONT_END = "owui"


@dataclass
class Found:
    """What the server said of itself."""

    url: str
    kind: str  # ollama | llamacpp
    models: list[str] = field(default_factory=list)
    slots: int | None = None  # llama-server's total_slots; Ollama does not say


def add_init_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--backend",
        metavar="URL",
        help="the Ollama or llama-server to put the gateway in front of "
        f"(default: the first that answers of {', '.join(_CANDIDATES)})",
    )
    parser.add_argument(
        "--person",
        action="append",
        default=[],
        metavar="NAME",
        help="someone who will use it (repeat; the first is the admin); asked if none",
    )
    parser.add_argument(
        "--open-webui", action="store_true", help="add Open WebUI, its people told apart"
    )
    parser.add_argument("--output", default="fairgate.yaml", help="where to write the policy")
    parser.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    parser.set_defaults(run=run_init)


def run_init(args: argparse.Namespace) -> int:
    output = Path(args.output)
    if output.exists() and not args.force:
        print(f"{output} exists; --force to replace it, or --output elsewhere", file=sys.stderr)
        return 1
    if not output.parent.is_dir():
        print(f"no directory {output.parent}: create it, or --output elsewhere", file=sys.stderr)
        return 1
    backend = (
        args.backend if not args.backend or "://" in args.backend else f"http://{args.backend}"
    )
    found = _probe(backend)
    if found is None:
        tried = backend or " or ".join(_CANDIDATES)
        print(
            f"no Ollama or llama-server answered at {tried} (a gateway is not one: give the "
            "server behind it): start it, or give its address with --backend http://HOST:PORT",
            file=sys.stderr,
        )
        return 1
    people = args.person or _ask_people()
    said = _names_refused(people, args.open_webui)
    if said is not None:
        print(said, file=sys.stderr)
        return 1
    keys = {name: new_key() for name in dict.fromkeys(people)}
    if args.open_webui:
        keys[_FRONT_END] = new_key()
    _write(output, _policy(found, keys, args.open_webui))
    print(_next_steps(found, keys, output, args.open_webui))
    return 0


def _names_refused(people: list[str], open_webui: bool) -> str | None:
    """Why the names given cannot be the household's users, or None."""
    bad = [name for name in people if not _NAME.match(name)]
    if not people or bad:
        said = f"not a name: {', '.join(bad)}" if bad else "nobody given"
        return f"{said}; names are lower-case letters, digits, - and _"
    # Whoever brings no key is `anonymous`; `unknown` is how metrics count unknown keys;
    # the front end's name is its own.
    reserved = {ANONYMOUS, UNKNOWN} | ({_FRONT_END} if open_webui else set())
    taken = [name for name in people if name in reserved]
    if taken:
        return f"{', '.join(taken)}: a name the gateway gives others already; choose another"
    return None


def _write(output: Path, text: str) -> None:
    """Written beside, read back as the gateway reads a policy, then put in place: what
    lands at ``output`` is whole, a policy the gateway serves, and the admin's alone."""
    written = output.with_name(f".{output.name}.init")
    written.write_text(text)
    try:
        written.chmod(0o600)
        load_policy(written)
        os.replace(written, output)
    finally:
        written.unlink(missing_ok=True)


def _probe(url: str | None) -> Found | None:
    for candidate in (url,) if url else _CANDIDATES:
        base = candidate.rstrip("/")
        if _get(base + "/healthz") == {"status": "alive"}:
            continue  # a gateway (this one, on 8080): it relays Ollama's version, and is not it
        if (version := _get(base + "/api/version")) is not None and "version" in version:
            tags = _get(base + "/api/tags") or {}
            models = [
                str(m["name"])
                for m in tags.get("models", [])
                if isinstance(m, dict) and "name" in m
            ]
            return Found(base, "ollama", models)
        if (props := _get(base + "/props")) is not None:
            listed = _get(base + "/v1/models") or {}
            models = [
                str(m["id"]) for m in listed.get("data", []) if isinstance(m, dict) and "id" in m
            ]
            if props.get("role") == "router":  # --models-dir: a child server per model
                return Found(base, "llamacpp-router", models)
            slots = props.get("total_slots")
            return Found(base, "llamacpp", models, slots if isinstance(slots, int) else None)
    return None


def _get(url: str) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT) as reply:
            found = json.loads(reply.read(1 << 20))
    except (OSError, ValueError, urllib.error.URLError):
        return None
    return found if isinstance(found, dict) else None


def _ask_people() -> list[str]:
    if not sys.stdin.isatty():
        return []
    answer = input("Who will use it? Names, separated by spaces (the first is the admin): ")
    return answer.lower().split()


def _policy(found: Found, keys: dict[str, str], open_webui: bool) -> str:
    people = [name for name in keys if name != _FRONT_END or not open_webui]
    lines = [
        "# Fairgate policy, written by `fairgate init`. Check it with",
        "# `fairgate check-config fairgate.yaml`; the running gateway re-reads it when it",
        "# changes. The keys are kept here as digests: their plain form was shown once.",
        "# More of what can go here: deploy/fairgate.example.yaml and docs/policy.md.",
        "",
        "defaults:",
        "  max_concurrent: 1   # requests of one person running at once",
        "  max_queued: 2       # and waiting; one more is told at once to try again",
        "",
        "queue:",
        "  max_depth: 16       # waiting, everybody together",
        "  max_wait: 30s       # longest wait for a turn before a 503",
        "",
        "scheduling: fair      # a short question goes ahead of a long prompt",
        "",
        "users:",
    ]
    for index, name in enumerate(people):
        lines.append(f"  {name}:")
        lines.append(f'    keys: ["{hashed_key(keys[name])}"]')
        if index == 0:
            lines.append("    admin: true         # may read /status and the house page")
    if open_webui:
        lines += [
            f"  {_FRONT_END}:               # Open WebUI: one key, its people told apart",
            f'    keys: ["{hashed_key(keys[_FRONT_END])}"]',
            "    on_behalf:",
            "      header: X-OpenWebUI-User-Email",
            "      total: {max_queued: 8}   # whatever names it sends: half the room at most",
        ]
    lines += ["", "backends:", *_backend(found)]
    return "\n".join(lines) + "\n"


def _backend(found: Found) -> list[str]:
    if found.kind == "llamacpp-router":
        return [
            "  - name: local",
            f"    url: {found.url}",
            "    kind: llamacpp-router",
            "    # its models, --models-max and each model's slots are read from it",
        ]
    if found.kind == "llamacpp":
        said = f"its {found.slots} slots" if found.slots else "its slots"
        return [
            "  - name: local",
            f"    url: {found.url}",
            "    kind: llamacpp",
            f"    # {said} are read from its /props (-np): no slots: line needed",
        ]
    return [
        "  - name: local",
        f"    url: {found.url}",
        "    kind: ollama",
        "    slots: 1            # OLLAMA_NUM_PARALLEL on that server (unset: 1); say it here",
    ]


def _next_steps(found: Found, keys: dict[str, str], output: Path, open_webui: bool) -> str:
    served = ", ".join(found.models) if found.models else "none yet"
    width = max(len(name) for name in keys)
    shown = "\n".join(f"  {name:<{width}}  {key}" for name, key in keys.items())
    bin_dir = Path(sys.executable).parent
    command = bin_dir / "fairgate" if (bin_dir / "fairgate").exists() else Path("fairgate")
    port = local_gateway().rsplit(":", 1)[1]  # where FAIRGATE_LISTEN puts it
    steps = [
        f"Wrote {output} (readable by you alone): in front of {found.kind} at {found.url}; "
        f"models there: {served}.",
        "",
        "Each person's key, shown this once (the file holds only their digests):",
        shown,
        "",
        "Next:",
        f"  1. Serve:  FAIRGATE_CONFIG={output} {command} serve   (or: make run); other",
        f"     machines reach it once it listens on them: FAIRGATE_LISTEN=0.0.0.0:{port}",
        f"  2. Point clients at http://THIS-MACHINE:{port} with their key:",
        f"       OLLAMA_HOST=http://THIS-MACHINE:{port} OLLAMA_API_KEY=KEY ollama run MODEL",
        f"       OPENAI_BASE_URL=http://THIS-MACHINE:{port}/v1 OPENAI_API_KEY=KEY",
        f"  3. Watch:  {command} status --watch, or http://localhost:{port}/ui",
    ]
    if open_webui:
        steps += [
            "",
            "Open WebUI: Admin -> Settings -> Connections -> Ollama API at",
            f"  http://THIS-MACHINE:{port} with the key of {_FRONT_END}; start it with",
            "  ENABLE_FORWARD_USER_INFO_HEADERS=True (each person then counts as themself),",
            "  and grant its users the models (BYPASS_MODEL_ACCESS_CONTROL=True, or per model).",
        ]
    if os.name == "posix":
        steps.append(f"\nKeep {output} out of version control: it is your household's.")
    return "\n".join(steps)
