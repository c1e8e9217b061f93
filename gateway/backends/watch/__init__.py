"""The watch over every backend, off the request path: probes on an interval, the monitor
that applies them, keep-warm pings, a swap's unloads, copies between llama-server's slots,
and failures put in words an admin can act on.

May import: ``backends``, ``relay``, ``edge``, ``config``, ``wire``, ``core``.
"""

from gateway.backends.watch.keep_warm import KeepWarm, WarmthSnapshot
from gateway.backends.watch.monitor import BackendMonitor
from gateway.backends.watch.probes import entries_of, names_of
from gateway.backends.watch.slot_copies import SlotCopies
from gateway.backends.watch.unloads import unload_models

__all__ = [
    "BackendMonitor",
    "KeepWarm",
    "SlotCopies",
    "WarmthSnapshot",
    "entries_of",
    "names_of",
    "unload_models",
]
