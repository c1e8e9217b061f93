"""admission."""

from gateway.admission.admission import Admission, Permit, Ticket
from gateway.admission.holds.base import HoldStore, StoreUnavailable
from gateway.admission.holds.redis import RedisHolds
from gateway.admission.refusals import REVOKED, Refusal
from gateway.admission.room_snapshot import RoomSnapshot, RunningRequest, WaitingRequest

__all__ = [
    "REVOKED",
    "Admission",
    "HoldStore",
    "Permit",
    "RedisHolds",
    "Refusal",
    "RoomSnapshot",
    "RunningRequest",
    "StoreUnavailable",
    "Ticket",
    "WaitingRequest",
]
