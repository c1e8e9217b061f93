"""Typed keys for what the application holds: explicit state, no module-level singletons."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from gateway.admission import Admission
from gateway.backends import BackendMonitor
from gateway.live import LivePolicy
from gateway.settings import Settings
from gateway.warmth import KeepWarm

__all__ = ["ADMISSION", "LIVE", "MONITOR", "SESSION", "SETTINGS", "WARMTH"]

SETTINGS = web.AppKey("settings", Settings)
LIVE = web.AppKey("live_policy", LivePolicy)
ADMISSION = web.AppKey("admission", Admission)
SESSION = web.AppKey("session", aiohttp.ClientSession)
MONITOR = web.AppKey("backend_monitor", BackendMonitor)
WARMTH = web.AppKey("keep_warm", KeepWarm)
