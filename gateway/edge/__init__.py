"""edge."""

from gateway.edge.access_log import access_log, error_response
from gateway.edge.connections import Connections, Listener
from gateway.edge.cors import Cors
from gateway.edge.forwarded import Client
from gateway.edge.headers import NO_STORE, decoded, forwarded_headers, returned_pairs
from gateway.edge.host_names import names_gateway, refuse_unknown_host
from gateway.edge.hot_routes import HOT_PATHS
from gateway.edge.identity import Caller, Directory
from gateway.edge.record import RECORD, Progress, RecordListener, RequestRecord
from gateway.edge.reply_headers import ReplyHeaders, put

__all__ = [
    "HOT_PATHS",
    "NO_STORE",
    "RECORD",
    "Caller",
    "Client",
    "Connections",
    "Cors",
    "Directory",
    "Listener",
    "Progress",
    "RecordListener",
    "ReplyHeaders",
    "RequestRecord",
    "access_log",
    "decoded",
    "error_response",
    "forwarded_headers",
    "names_gateway",
    "put",
    "refuse_unknown_host",
    "returned_pairs",
]
