"""The policy in force, swapped whole when the YAML file changes or on SIGHUP.

A request reads ``LivePolicy.current`` once and keeps that view to its end, so a reload
never changes the rules under a request that is already being handled.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from gateway.backends import BackendPool, BackendStates
from gateway.config import Policy, PolicyError, load_policy
from gateway.core import repeat
from gateway.edge import Directory

__all__ = ["OPEN_GATEWAY", "LivePolicy", "PolicyView", "ReloadSnapshot", "policy_changes"]

log = structlog.get_logger("fairgate.policy")

OPEN_GATEWAY = "no users in the policy: anyone who can reach it may use it"


@dataclass(frozen=True, slots=True)
class PolicyView:
    """One version of the policy with what is derived from it."""

    policy: Policy
    directory: Directory
    pool: BackendPool

    @classmethod
    def of(cls, policy: Policy, states: BackendStates) -> PolicyView:
        return cls(policy, Directory(policy), BackendPool(policy.backends, states))


@dataclass(frozen=True, slots=True)
class ReloadSnapshot:
    path: str | None
    reloads_ok: int
    reloads_failed: int
    last_error: str | None


class LivePolicy:
    """Holds the current PolicyView and replaces it when the file changes."""

    def __init__(self, policy: Policy, states: BackendStates, path: Path | None = None) -> None:
        self.states = states
        self.current = PolicyView.of(policy, states)
        self.path = path
        self.on_reload: list[Callable[[PolicyView], None]] = []
        self.on_reload_failed: list[Callable[[str], None]] = []
        self.reloads_ok = 0
        self.reloads_failed = 0
        self.last_error: str | None = None
        self._seen = self._version_holding(policy)
        self._settling: tuple[int, int, int] | None = None  # a change seen, not yet read

    def _version_holding(self, policy: Policy) -> tuple[int, int, int] | None:
        """The file's fingerprint if it still holds ``policy``; None if it was edited since
        ``policy`` was read from it, which the watch then reads as a change. At start the
        policy was read before the app was built, a second or more ago: an edit saved then
        changed the fingerprint before it was first taken, and would never be applied."""
        seen = _fingerprint(self.path)
        if self.path is None or not self.path.is_file():
            return seen  # a pipe (a policy decrypted on the fly) cannot be read twice
        try:
            unchanged = load_policy(self.path) == policy
        except PolicyError:
            unchanged = False  # the watch's reload says why, as it does for any bad edit
        return seen if unchanged else None

    def reload(self) -> bool:
        """Re-read the file; keep the old policy (and say why) when the new one is invalid."""
        if self.path is None:
            return False
        self._seen = _fingerprint(self.path)
        try:
            policy = load_policy(self.path)
        except PolicyError as exc:
            self.reloads_failed += 1
            self.last_error = str(exc)
            log.error("policy_reload_failed", path=str(self.path), error=str(exc))
            for failure_listener in self.on_reload_failed:
                failure_listener(str(exc))
            return False
        changes = policy_changes(self.current.policy, policy)
        self.current = PolicyView.of(policy, self.states)
        for listener in self.on_reload:
            listener(self.current)
        self.reloads_ok += 1
        self.last_error = None
        # A file touched, or only its comments edited, still reloads: say that nothing changed.
        fields: dict[str, object] = {**changes} or {"unchanged": True}
        log.info("policy_reloaded", path=str(self.path), users=len(policy.users), **fields)
        if not policy.users:
            log.warning("open_gateway", hint=OPEN_GATEWAY)
        return True

    def snapshot(self) -> ReloadSnapshot:
        path = str(self.path) if self.path else None
        return ReloadSnapshot(path, self.reloads_ok, self.reloads_failed, self.last_error)

    async def watch(self, interval: float) -> None:
        """Reload whenever the file's identity, size or mtime changes (edits, renames, k8s)."""
        await repeat(interval, self._reload_if_changed)

    def _reload_if_changed(self) -> None:
        if self.path is None:
            return
        now = _fingerprint(self.path)
        if now == self._seen:
            self._settling = None
        elif now != self._settling:
            # Read once it has stood still for an interval: a file written in two steps (a
            # script, a slow copy) read between them could drop every user, opening the
            # gateway until the next look. SIGHUP (reload) reads at once.
            self._settling = now
        else:
            self.reload()


def policy_changes(old: Policy, new: Policy) -> dict[str, list[str]]:
    """What a reload changes, by name: users and backends added, removed or changed, and the
    other top-level sections changed. Only what is non-empty, so that the log line says what
    happened and nothing else."""
    changes = {
        **_named_changes("users", old.users, new.users),
        **_named_changes("backends", _by_name(old), _by_name(new)),
        "sections_changed": [
            name
            for name in type(new).model_fields
            if name not in ("users", "backends") and getattr(old, name) != getattr(new, name)
        ],
    }
    return {key: names for key, names in changes.items() if names}


def _by_name(policy: Policy) -> dict[str, object]:
    return {backend.name: backend for backend in policy.backends}


def _named_changes(
    what: str, old: Mapping[str, object], new: Mapping[str, object]
) -> dict[str, list[str]]:
    return {
        f"{what}_added": [name for name in new if name not in old],
        f"{what}_removed": [name for name in old if name not in new],
        f"{what}_changed": [name for name in new if name in old and old[name] != new[name]],
    }


def _fingerprint(path: Path | None) -> tuple[int, int, int] | None:
    if path is None:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_ino, stat.st_size, stat.st_mtime_ns
