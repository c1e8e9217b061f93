"""Copying one llama-server slot's prompt into another, so that a second slot holds it too.

A slot holds the prompt it last evaluated; a conversation whose tools and history one slot
holds costs a whole prefill on any other, and the engine has no way to share a prompt
between slots by itself (its host-memory cache, ``--cache-ram``, loads a saved prompt only
into a slot that held something else). Started with ``--slot-save-path DIR``, llama-server
saves a slot's cache to a file in DIR and restores it into another slot
(``POST /slots/N?action=save|restore``): measured on the pinned server, 2,458 tokens of
SmolLM2-135M copied in 34 ms where their prefill took 9.2 s on the CPU. Where the gateway
decides a copy (``admission/prompt_caches.py``), this module makes it, and requests sent to
either slot wait until it is done: a request reaching the target slot first would be
evaluated cold, and the restore would then replace what it left.

The file is named after the server (a digest of its URL: two servers may share a directory)
and the source slot, so the directory holds at most one file per server and slot, each
overwritten by the next copy. A server started without the option
answers 501; the gateway then stops asking it for a while.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable

import aiohttp
import structlog

from gateway.backends.pool import Backend
from gateway.relay import Upstream

__all__ = ["CopyDone", "SlotCopies"]

log = structlog.get_logger("fairgate.slots")

_COPY_TIMEOUT = aiohttp.ClientTimeout(total=30.0)  # a large model's slot to disk and back


# Told how a copy went: the seconds it took, None if it failed; and whether the server
# cannot copy at all (not started with ``--slot-save-path``).
CopyDone = Callable[[float | None, bool], None]


class SlotCopies:
    """The copies under way, by backend and slot, for requests to wait on."""

    def __init__(self, upstream: Upstream) -> None:
        self._upstream = upstream
        self._under_way: dict[tuple[str, int], asyncio.Task[bool]] = {}

    def start(self, backend: Backend, source: int, target: int, done: CopyDone) -> None:
        """Copy ``source``'s prompt into ``target`` on ``backend``; ``done`` is told how it
        went, also when the gateway stops first."""
        task = asyncio.get_running_loop().create_task(
            self._copy(backend, source, target, done), name=f"slot-copy-{backend.name}"
        )
        keys = [(backend.key, source), (backend.key, target)]
        for key in keys:
            self._under_way[key] = task

        def finished(_: asyncio.Task[bool]) -> None:
            for key in keys:
                if self._under_way.get(key) is task:
                    del self._under_way[key]

        task.add_done_callback(finished)

    async def ready(self, backend: Backend, slot: int, within: float) -> bool:
        """Once no copy from or into ``slot`` of ``backend`` is under way, or ``within``
        seconds have passed: False if a copy it waited for failed or is not done (the slot
        may not hold what was planned)."""
        task = self._under_way.get((backend.key, slot))
        if task is None:
            return True
        await asyncio.wait((task,), timeout=within)
        if not task.done() or task.cancelled() or task.exception() is not None:
            return False
        return task.result()

    async def close(self) -> None:
        tasks = set(self._under_way.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    async def _copy(self, backend: Backend, source: int, target: int, done: CopyDone) -> bool:
        seconds, unsupported = None, False
        try:
            seconds, unsupported = await self._save_and_restore(backend, source, target)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            log.warning("slot_copy_failed", backend=backend.name, error=repr(exc))
        finally:
            done(seconds, unsupported)
        return seconds is not None

    async def _save_and_restore(
        self, backend: Backend, source: int, target: int
    ) -> tuple[float | None, bool]:
        started = time.monotonic()
        server = hashlib.blake2b(backend.key.encode(), digest_size=4).hexdigest()
        body = {"filename": f"fairgate-{server}-slot-{source}.bin"}
        for slot, action in ((source, "save"), (target, "restore")):
            url = f"{backend.url.rstrip('/')}/slots/{slot}?action={action}"
            async with self._upstream.session.post(url, json=body, timeout=_COPY_TIMEOUT) as reply:
                said = await reply.read()
            if reply.status in (404, 405, 501):  # no such option, or an older server
                log.warning(
                    "slot_copies_unsupported",
                    backend=backend.name,
                    hint="start llama-server with --slot-save-path DIR to let the gateway copy "
                    "a slot's prompt to another slot instead of evaluating it again",
                )
                return None, True
            if reply.status != 200:
                detail = said[:200].decode(errors="replace")
                log.warning("slot_copy_refused", backend=backend.name, action=action, said=detail)
                return None, False
        seconds = time.monotonic() - started
        log.info("slot_copied", backend=backend.name, source=source, target=target, seconds=seconds)
        return seconds, False
