"""``fairgate status``: the house page as a table in the terminal, like ``ollama ps``.

It reads the same ``/status`` JSON as the page (so an admin key, or a gateway on this
machine), with the standard library only: it runs wherever the gateway is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from gateway.config import Settings, environment, parse_listen, variable
from gateway.core import format_size, printable

__all__ = [
    "add_status_arguments",
    "duration_text",
    "local_gateway",
    "render_text",
    "run_status",
    "table",
]

_CLEAR = "\x1b[H\x1b[2J"  # cursor home, clear the screen: one frame per refresh


class StatusError(Exception):
    """The gateway could not be read: unreachable, refused the key, or not a gateway."""


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        help="the gateway (default: this machine's, at FAIRGATE_LISTEN's port)",
    )
    parser.add_argument(
        "--key",
        default=os.environ.get("FAIRGATE_KEY"),
        help="an admin key, if the gateway is on another machine (default: $FAIRGATE_KEY)",
    )
    parser.add_argument("--watch", action="store_true", help="redraw every --interval seconds")
    parser.add_argument(
        "--interval", type=_interval, default=1.0, help="seconds between redraws (at least 0.1)"
    )


def _interval(text: str) -> float:
    seconds = float(text)  # argparse words a ValueError as "invalid _interval value"
    if not seconds >= 0.1 or seconds == float("inf"):  # nan compares false
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds of at least 0.1")
    return seconds


_LISTEN: str = Settings.model_fields["listen"].default


def local_gateway() -> str:
    """The gateway on this machine: at FAIRGATE_LISTEN (the environment's, else .env's)."""
    try:
        host, port = parse_listen(variable(environment(), "FAIRGATE_LISTEN") or _LISTEN)
    except ValueError:
        host, port = parse_listen(_LISTEN)  # serve says what is wrong with it
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # every address: ask loopback
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def run_status(args: argparse.Namespace) -> int:
    args.url = args.url or local_gateway()
    if not args.watch:
        try:
            print(render_text(fetch(args.url, args.key)))
        except StatusError as exc:
            print(f"fairgate status: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        while True:
            try:
                frame = render_text(fetch(args.url, args.key))
            except StatusError as exc:
                frame = f"fairgate status: {exc} (retrying)"
            print(f"{_CLEAR}{frame}\n\n{args.url} at {datetime.now():%H:%M:%S}", flush=True)
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


def fetch(url: str, key: str | None) -> dict[str, Any]:
    request = urllib.request.Request(url.rstrip("/") + "/status")
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            body: dict[str, Any] = json.load(reply)
            return body
    except urllib.error.HTTPError as exc:
        raise StatusError(f"{url} answered {exc.code}: {_message(exc)}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise StatusError(f"cannot reach {url}: {exc}") from None
    except ValueError as exc:
        raise StatusError(f"{url}/status is not a gateway's status: {exc}") from None


def _message(error: urllib.error.HTTPError) -> str:
    try:
        detail = json.load(error).get("error", "")
    except ValueError:
        return str(error.reason)
    return str(detail.get("message", "") if isinstance(detail, dict) else detail)


def render_text(status: dict[str, Any]) -> str:
    """The whole picture: slots, who runs, who waits, each user, recent refusals."""
    backends, queue = status["backends"], status["queue"]
    house = status.get("slots") or {"busy": "?", "total": "?"}  # a gateway before it said
    head = f"{house['busy']} of {house['total']} slots busy, {queue['depth']} waiting"
    if queue["depth"]:
        head += f" (oldest {duration_text(queue['oldest_wait_seconds'])})"
    refused_edit = status["policy"]["last_error"]
    if refused_edit:  # the admin's last edit did not take: said first, not only in the log
        head = f"{head}\nthe policy file's last edit was refused (still serving the one before):"
        head += "\n  " + refused_edit.replace("\n", "\n  ")
    where = _replicas(status)
    running, waiting = _running(status["running"], where), _waiting(queue["waiting"], where)
    parts = [head, _backends(backends), running, waiting]
    # What is wrong with a backend, and the fix, as /status says it.
    troubles = [
        f"{name}: {b[said]}"
        for said in ("runs_fewer", "failed_to_load")
        for name, b in backends.items()
        if b.get(said)
    ]
    if troubles:
        parts.insert(2, "\n".join(troubles))
    parts.append(_users(status["users"]))
    if status["refusals"]:
        parts.append(_refusals(status["refusals"][:5]))
    if status.get("strangers"):  # a wrong key's refusals, apart from the household's
        parts.append(_refusals(status["strangers"][:5], "NOT RECOGNISED"))
    return "\n\n".join(parts)


def _backends(backends: dict[str, Any]) -> str:
    rows = [
        [
            name,
            b["kind"],
            ("sleeping" if b["sleeping"] else "up") if b["healthy"] else "down",
            f"{b['busy']}/{b['slots']}",
            f"{b['heavy_running']}/{b['heavy_slots']}",
            _in_memory(b),
        ]
        for name, b in backends.items()
    ]
    return table(["BACKEND", "KIND", "STATE", "SLOTS", "HEAVY", "IN MEMORY"], rows)


def _in_memory(backend: dict[str, Any]) -> str:
    """Ollama's models with their context and size against the budget: "llama3.2:3b (4k,
    2.3 GiB) = 2.3 of 8.0 GiB"; the router's by name; other kinds: what they list as
    loaded. Then the swap under way, if one is."""
    models = backend.get("models")
    if models is None:
        return ", ".join(backend["loaded"]) or "-"
    if backend["kind"] == "llamacpp-router":  # it says no sizes: it counts models
        held = f"{', '.join(models) or '-'} (at most {backend['max_loaded_models'] or 'any'})"
    else:
        held = ", ".join(
            f"{name} ({m['num_ctx'] // 1024}k, {format_size(m['size'])})"
            for name, m in models.items()
        )
        memory = backend["memory"]
        budget = "" if memory["budget"] is None else f" of {format_size(memory['budget'])}"
        held = f"{held or '-'} = {format_size(memory['used'])}{budget}"
    swap = backend.get("swap")
    if swap is None:
        return held
    return f"{held}; swapping in {swap['model']} (draining {', '.join(swap['draining'])})"


# A request's REPLICA column, with several replicas (None: one, and no column).
Where = Callable[[dict[str, Any]], list[str]] | None


def _replicas(status: dict[str, Any]) -> Where:
    """With several replicas, each request's: "here" (the one asked), or another's name."""
    state = status["state"]
    if state.get("replicas", 1) < 2:
        return None
    here = state.get("replica")
    return lambda request: [
        "here" if request.get("replica") in (None, here) else request["replica"]
    ]


def _running(running: list[dict[str, Any]], where: Where) -> str:
    if not running:
        return "nothing running"
    rows = [
        [r["user"], r["model"], r["backend"], r["class"], r["lane"], duration_text(r["seconds"])]
        + (where(r) if where else [])
        for r in running
    ]
    head = ["RUNNING", "MODEL", "BACKEND", "CLASS", "LANE", "FOR"]
    return table(head + (["REPLICA"] if where else []), rows)


def _waiting(waiting: list[dict[str, Any]], where: Where) -> str:
    if not waiting:
        return "nobody waiting"
    rows = [
        [
            str(w["position"]),
            w["user"],
            w["model"],
            w["class"],
            w["lane"],
            duration_text(w["waited_seconds"]),
            "~" + duration_text(w["estimated_start_seconds"]),
        ]
        + (where(w) if where else [])
        for w in waiting
    ]
    head = ["#", "WAITING", "MODEL", "CLASS", "LANE", "WAITED", "STARTS IN"]
    return table(head + (["REPLICA"] if where else []), rows)


def _users(users: dict[str, Any]) -> str:
    rows = [
        [
            name,
            _of(u["running"], u["max_concurrent"]),
            _of(u["queued"], u["max_queued"]),
            str(u["today"]["requests"]),
            str(u["today"]["prompt_tokens"] + u["today"]["completion_tokens"]),
            str(u["today"]["refused"]),
            duration_text(u["today"]["slot_seconds"]),
            _budget_left(u["budget"]),
        ]
        for name, u in users.items()
    ]
    header = ["USER", "RUNNING", "QUEUED", "REQUESTS TODAY", "TOKENS", "REFUSED", "SLOT TIME"]
    return table([*header, "BUDGET LEFT"], rows)


_BUDGET_UNITS = {
    "tokens_per_day": "tokens/day",
    "requests_per_minute": "req/min",
    "requests_per_hour": "req/h",
    "slot_seconds_per_day": "slot/day",
}


def _budget_left(budget: dict[str, Any]) -> str:
    """``99/100 req/h, 1h20m/2h slot/day``: what is left of each limit, or -."""
    parts = []
    for name, limit in budget.items():
        if name == "slot_seconds_per_day":
            left = f"{duration_text(limit['remaining'])}/{duration_text(limit['limit'])}"
        else:
            left = f"{limit['remaining']:,.0f}/{limit['limit']:,.0f}"
        parts.append(f"{left} {_BUDGET_UNITS.get(name, name)}")
    return ", ".join(parts) or "-"


def _refusals(refusals: list[dict[str, Any]], heading: str = "REFUSED AT") -> str:
    rows = [
        [
            f"{datetime.fromtimestamp(r['at']):%H:%M:%S}",
            r["user"] or "-",
            r["reason"],
            r["model"] or r["path"],
        ]
        for r in refusals
    ]
    return table([heading, "USER", "REASON", "MODEL"], rows)


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns three spaces apart, as ``ollama ps`` prints them. Every cell is
    made printable: a refused request's path or model is a stranger's text, and a terminal
    acts on the escapes in it (clears the screen, retitles the window, writes the
    clipboard)."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


def _of(value: int, limit: int | None) -> str:
    return str(value) if limit is None else f"{value}/{limit}"


def duration_text(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
