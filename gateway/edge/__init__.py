"""The client side that needs no server: who is calling (keys, basic auth, addresses), where
from behind trusted proxies, the host names answered, and the record of one request that the
access log, the metrics, the history and the ledger read.

The aiohttp server itself is ``edge.http``, a face of its own, so that this one loads without
the web stack.

May import: ``config``, ``wire``, ``core``.
"""

from gateway.edge.forwarded import Client
from gateway.edge.host_names import names_gateway, refuse_unknown_host
from gateway.edge.identity import Caller, Directory
from gateway.edge.record import Progress, RecordListener, RequestRecord

__all__ = [
    "Caller",
    "Client",
    "Directory",
    "Progress",
    "RecordListener",
    "RequestRecord",
    "names_gateway",
    "refuse_unknown_host",
]
