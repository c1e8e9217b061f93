"""Big bodies and the event loop: how long another user's stream stalls while the gateway
parses an image or a body of a million values, and what the bodies past the bounds cost.

bob streams at 1,000 tokens/s from one simulator, a line each millisecond, so that the
longest gap in his stream is about the longest stall of the gateway's loop. alice sends one
body at a time, from a child process, for a model that another simulator serves (its own
parsing stalls nobody measured here):

- image: an /api/generate with one base64 image, the body just under 32 MiB (the default
  FAIRGATE_MAX_BODY_BYTES);
- values: a context of 999,995 token ids (151936), a body of a million values, the most
  that passes (6.7 MiB);
- numbers: 32 MiB of context, ``[1,1,1,...]`` (16.7M values: refused after the change);
- arrays: 32 MiB of ``[[],[],...]`` in a format schema (11M arrays: refused after).

Printed for each gateway, the one at ``--before DIR`` (a copy of an older tree, e.g.
``git archive main | tar -x -C DIR``) and this tree's, side by side in one run: alice's
status and time from her first byte to the answer, bob's longest gap while her body was in
the gateway against his longest in a quiet second just before, and the gateway's RSS peak.

    .venv/bin/python -m benchmarks.big_bodies [--before DIR] [--bodies image,values]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from tests.processes import free_port, stop, until_answers

BOB_MODEL, ALICE_MODEL = "llama3.2:3b", "qwen2.5:7b"
MIB = 1024 * 1024
BODY_LIMIT = 32 * MIB
KINDS = ("image", "values", "numbers", "arrays")


def body_of(kind: str) -> bytes:
    """alice's body of ``kind`` (see the module's docstring)."""
    head = f'{{"model": "{ALICE_MODEL}", "prompt": "what is this?", "stream": false, '.encode()
    room = BODY_LIMIT - len(head) - 1024
    if kind == "image":
        image = base64.b64encode(os.urandom(room // 4 * 3))
        return head + b'"images": ["' + image + b'"]}'
    if kind == "values":  # the object, its four fields and the numbers: 1,000,000
        return head + b'"context": [' + b",".join([b"151936"] * 999_995) + b"]}"
    if kind == "numbers":
        return head + b'"context": [' + b",".join([b"1"] * (room // 2)) + b"]}"
    return head + b'"format": {"a": [' + b",".join([b"[]"] * (room // 3)) + b"]}}"


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def _send(port: int, kind: str) -> dict[str, float]:
    """One body of ``kind`` to the gateway at ``port``: status, when sending started and
    when the status line came (monotonic clock, which the parent shares)."""
    body = body_of(kind)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST /api/generate HTTP/1.1\r\nHost: g\r\nAuthorization: Bearer alice-key\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    writer.write(head + body)
    line = await reader.readline()
    answered = time.monotonic()
    writer.close()
    return {"status": float(line.split()[1]), "started": started, "answered": answered}


async def _bob(url: str, gaps: list[tuple[float, float]], done: asyncio.Event) -> None:
    body = {"model": BOB_MODEL, "prompt": "talk", "options": {"num_predict": 10_000_000}}
    headers = {"Authorization": "Bearer bob-key"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/api/generate", json=body, headers=headers) as reply,
    ):
        last = time.monotonic()
        while not done.is_set() and await reply.content.readline():
            now = time.monotonic()
            gaps.append((now, now - last))
            last = now


def _longest(gaps: list[tuple[float, float]], start: float, end: float) -> float:
    return max((gap for at, gap in gaps if start <= at <= end), default=float("nan"))


async def _measure(name: str, url: str, pid: int, port: int, kinds: list[str]) -> None:
    gaps: list[tuple[float, float]] = []
    done = asyncio.Event()
    bob = asyncio.create_task(_bob(url, gaps, done))
    for kind in kinds:
        quiet_from = time.monotonic()
        await asyncio.sleep(1.0)
        rss_before = peak = _rss_mib(pid)
        sender = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.big_bodies", "--send", str(port), kind,
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        waiting = asyncio.ensure_future(sender.communicate())
        while not waiting.done():
            peak = max(peak, _rss_mib(pid))
            await asyncio.wait([waiting], timeout=0.01)
        sent = json.loads((await waiting)[0])
        await asyncio.sleep(0.05)  # bob's next line shows a stall that ended with the answer
        quiet = _longest(gaps, quiet_from + 0.1, sent["started"])
        during = _longest(gaps, sent["started"], sent["answered"] + 0.05)
        took = (sent["answered"] - sent["started"]) * 1000
        print(
            f"  {name:6} {kind:8} {int(sent['status'])} in {took:6.0f} ms; bob's longest gap "
            f"{during * 1000:5.0f} ms (quiet {quiet * 1000:3.0f} ms); "
            f"RSS +{peak - rss_before:.0f} MiB",
            flush=True,
        )
    done.set()
    await bob


async def _sim(port: int, model: str, tokens_per_s: int) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "sim", "--port", str(port), "--models", model,
        "--decode-tps", str(tokens_per_s), "--prefill-tps", "0",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


async def _run(args: argparse.Namespace, workdir: Path) -> None:
    bob_port, alice_port = free_port(), free_port()
    sims = [await _sim(bob_port, BOB_MODEL, 1000), await _sim(alice_port, ALICE_MODEL, 0)]
    policy = workdir / "fairgate.yaml"
    policy.write_text(
        "users:\n  alice: {keys: [alice-key]}\n  bob: {keys: [bob-key]}\nbackends:\n"
        f"  - {{name: bob, url: http://127.0.0.1:{bob_port}, kind: ollama, slots: 2}}\n"
        f"  - {{name: alice, url: http://127.0.0.1:{alice_port}, kind: ollama, slots: 2}}\n"
    )
    gateways = [("before", args.before), ("after", None)] if args.before else [("after", None)]
    try:
        for port in (bob_port, alice_port):
            await until_answers(f"http://127.0.0.1:{port}/", 20)
        for name, tree in gateways:
            await _one_gateway(name, tree, policy, workdir, args.bodies.split(","))
    finally:
        for sim in sims:
            await stop(sim)


async def _one_gateway(
    name: str, tree: str | None, policy: Path, workdir: Path, kinds: list[str]
) -> None:
    port = free_port()
    env = {**os.environ, "FAIRGATE_CONFIG": str(policy), "FAIRGATE_LOG_LEVEL": "WARNING"}
    env["FAIRGATE_USAGE_DB"] = str(workdir / f"{name}.db")
    env["FAIRGATE_LISTEN"] = f"127.0.0.1:{port}"
    env["FAIRGATE_MAX_BODY_BYTES"] = str(BODY_LIMIT)
    if tree is not None:  # `-m` puts the working directory first on the path
        env["PYTHONPATH"] = tree
    gateway = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", env=env, cwd=tree,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        await until_answers(url + "/", 20, gateway)
        await asyncio.sleep(1.0)  # the backends' first probes
        await _measure(name, url, gateway.pid, port, kinds)
    finally:
        await stop(gateway)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", metavar="DIR", help="an older tree to compare with")
    parser.add_argument("--bodies", default=",".join(KINDS), help="of " + ", ".join(KINDS))
    parser.add_argument("--send", nargs=2, metavar=("PORT", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.send:  # the child that sends one body; prints what it saw
        port, kind = args.send
        print(json.dumps(asyncio.run(_send(int(port), kind))))
        return
    print("bob streams 1,000 tokens/s; alice sends one body at a time")
    with tempfile.TemporaryDirectory() as workdir, contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run(args, Path(workdir)))


if __name__ == "__main__":
    main()
