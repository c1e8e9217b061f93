"""The ``fairgate`` command: serve, check-config, keys, status, usage, sim, demo, plan."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
from types import FrameType

# A SIGHUP while Python imports the gateway (a logrotate, or a reload racing a restart)
# would end the process: its default action. Noted from the first line instead, and
# answered by serve with a reload once it listens (``_SighupLatch``); the other commands
# take the default back in ``main``.
_hangups: list[int] = []


def _note_hangups(handler: Callable[[int, FrameType | None], object] | signal.Handlers) -> None:
    """SIGHUP's handler, where the platform has the signal and this is the main thread (a
    program may call ``main`` from another; signals are then not its to set)."""
    if hasattr(signal, "SIGHUP"):
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGHUP, handler)


_note_hangups(lambda signum, frame: _hangups.append(signum))

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
from dotenv import dotenv_values
from pydantic import ValidationError

from gateway import __version__
from gateway.cli.check_config import add_check_arguments
from gateway.cli.first_run import listen_problem, warn_about_weak_keys
from gateway.cli.init import add_init_arguments
from gateway.cli.keys import add_keys_arguments
from gateway.cli.status import add_status_arguments, run_status
from gateway.cli.usage import add_usage_arguments, run_usage
from gateway.config import (
    PolicyError,
    Settings,
    describe_settings,
    dotenv_problems,
    load_policy,
    settings_errors,
    unknown_variables,
)
from gateway.core import configure_logging

__all__ = ["main"]

log = structlog.get_logger("fairgate.settings")


def main(argv: Sequence[str] | None = None) -> int:
    # Its warning of a .env line it cannot read names neither the file nor the line's fault,
    # once for every reader of the file: serve and check-config say it once, at its line.
    logging.getLogger("dotenv.main").setLevel(logging.ERROR)
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command != "serve":
        _note_hangups(signal.SIG_DFL)  # a terminal's hangup ends the other commands
    if args.command is None:
        parser.print_help()
        return 2
    result: int = args.run(args)
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairgate", description="Fair admission proxy for Ollama and llama.cpp servers."
    )
    parser.add_argument("--version", action="version", version=f"fairgate {__version__}")
    commands = parser.add_subparsers(dest="command")

    serve = commands.add_parser(
        "serve",
        help="run the gateway (settings from FAIRGATE_*)",
        description="Run the gateway. Flags win over the environment and .env.",
        epilog=describe_settings(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--config", metavar="FILE", help="the policy file (FAIRGATE_CONFIG)")
    serve.add_argument("--listen", metavar="HOST:PORT", help="where to listen (FAIRGATE_LISTEN)")
    serve.set_defaults(run=_serve)

    check = commands.add_parser(
        "check-config",
        help="validate a policy YAML file and the settings",
        description="Check what the service would read at start: the policy file and the "
        "FAIRGATE_* settings, from the environment and .env, or from --env-file.",
    )
    add_check_arguments(check)

    init = commands.add_parser(
        "init",
        help="write a first policy: the local server's models, the household, fresh keys",
    )
    add_init_arguments(init)

    keys = commands.add_parser("keys", help="make a key for a user, or hash one for the policy")
    add_keys_arguments(keys)

    status = commands.add_parser("status", help="who runs and who waits, as a table")
    add_status_arguments(status)
    status.set_defaults(run=run_status)

    usage = commands.add_parser(
        "usage",
        help="who used the box: requests, tokens, slot time, refusals",
        description="Usage per user (and model or day), read from FAIRGATE_USAGE_DB, or from "
        "Redis with FAIRGATE_REDIS_URL; settings and .env as for serve.",
    )
    add_usage_arguments(usage)
    usage.set_defaults(run=run_usage)

    _add_tool_commands(commands)
    return parser


def _add_tool_commands(commands: Any) -> None:
    """The simulator, the demo and the planner: tools beside the gateway, in their own
    packages. The gateway-only image does not ship them, and then does not offer them."""
    try:
        from fairplan import add_plan_arguments
        from fairsim import add_sim_arguments
    except ImportError:
        return
    sim = commands.add_parser("sim", help="run a simulated Ollama (or llama.cpp) server")
    add_sim_arguments(sim)
    sim.set_defaults(run=_sim)

    demo = commands.add_parser("demo", help="a simulated backend with the gateway in front")
    demo.add_argument("--port", type=int, default=8080, help="the gateway's port")
    demo.add_argument("--backend-port", type=int, default=11435, help="the simulator's port")
    demo.set_defaults(run=_demo)

    plan = commands.add_parser("plan", help="size slots, context and queues for a model")
    add_plan_arguments(plan)
    plan.set_defaults(run=_plan)


class _SighupLatch:
    """A SIGHUP before the event loop takes the signal over is noted, not fatal: its default
    action ends the process, and systemd does not restart a process ended by SIGHUP. The
    gateway re-reads its policy once it listens."""

    def __init__(self) -> None:
        self.received = bool(_hangups)  # one that came while the gateway was imported
        signal.signal(signal.SIGHUP, self._note)

    def _note(self, signum: int, frame: object) -> None:
        self.received = True


def _serve(args: argparse.Namespace) -> int:
    latch = _SighupLatch()  # first: settings and the policy file may take a while to read
    # Exit status 2 for anything the admin must fix before it can start: systemd's
    # Restart=on-failure then retries, and each failure is one line in the journal.
    flags = {name: value for name in ("config", "listen") if (value := getattr(args, name))}
    try:
        settings = Settings(**flags)
    except ValidationError as exc:
        for line in settings_errors(exc, {name: f"--{name}" for name in flags}):
            print(line, file=sys.stderr)
        return 2
    configure_logging(settings.log_format, settings.log_level)
    for sentence in dotenv_problems():
        log.warning("unread_setting", problem=sentence)
    for sentence in unknown_variables({**_dotenv(), **os.environ}):
        log.warning("unknown_setting", problem=sentence)
    try:
        policy = load_policy(settings.config)
    except PolicyError as exc:
        print(f"fairgate: cannot start: {exc}", file=sys.stderr)
        return 2
    warn_about_weak_keys(policy)
    from gateway.app import run_app
    from gateway.usage import StoreError

    try:
        run_app(settings, policy, sighup_before=lambda: latch.received)
    except StoreError as exc:
        print(f"fairgate: cannot keep usage (FAIRGATE_USAGE_DB): {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        problem = listen_problem(exc)
        if problem is None:
            raise
        print(f"fairgate: cannot listen on {settings.listen}: {problem}", file=sys.stderr)
        return 2
    return 0


def _dotenv() -> dict[str, str | None]:
    """The .env file's variables, as the settings read them (none if there is no file)."""
    return dotenv_values(".env") if Path(".env").is_file() else {}


def _sim(args: argparse.Namespace) -> int:
    from fairsim import run_sim, sim_config_from_args

    try:
        run_sim(sim_config_from_args(args), args.host, args.port)
    except OSError as exc:  # the port taken (a real Ollama on 11434), an address not ours
        print(f"fairgate sim: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}")
        return 2
    return 0


def _demo(args: argparse.Namespace) -> int:
    from gateway.cli.demo import run_demo

    try:
        run_demo(gateway_port=args.port, backend_port=args.backend_port)
    except OSError as exc:
        problem = listen_problem(exc)
        if problem is None:
            raise
        # Most often a gateway (make run) or a simulator (make sim) already has the port.
        print(
            f"fairgate demo: cannot listen on port {args.port} or {args.backend_port}: "
            f"{problem} (another gateway or simulator running? choose others with --port "
            "and --backend-port)",
            file=sys.stderr,
        )
        return 2
    return 0


def _plan(args: argparse.Namespace) -> int:
    from fairplan import run_plan

    return run_plan(args)


if __name__ == "__main__":
    sys.exit(main())
