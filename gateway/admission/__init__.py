"""The gateway owns the queue: the waiting room and whose turn it is, permits held with
``async with``, refusals as values, the replicas' shared holds, and the pure scheduler.

May import: ``swaps``, ``backends`` (the pool), ``config``, ``wire``, ``core`` (never
aiohttp); ``admission.scheduler`` imports only ``core``.
"""

from gateway.admission.admission import Admission
from gateway.admission.cache_contents import BLOCK_BYTES, CHARS_PER_TOKEN
from gateway.admission.holds.base import HoldStore, StoreUnavailable
from gateway.admission.holds.redis import RedisHolds
from gateway.admission.permit import Permit
from gateway.admission.preemption import Waste
from gateway.admission.prompt_caches import NO_PREFIX, Prefix, PromptCaches
from gateway.admission.refusals import REVOKED, Refusal
from gateway.admission.room_snapshot import (
    EstimatesSnapshot,
    RoomSnapshot,
    RunningRequest,
    WaitingRequest,
)
from gateway.admission.tickets import Ticket

__all__ = [
    "BLOCK_BYTES",
    "CHARS_PER_TOKEN",
    "NO_PREFIX",
    "REVOKED",
    "Admission",
    "EstimatesSnapshot",
    "HoldStore",
    "Permit",
    "Prefix",
    "PromptCaches",
    "RedisHolds",
    "Refusal",
    "RoomSnapshot",
    "RunningRequest",
    "StoreUnavailable",
    "Ticket",
    "WaitingRequest",
    "Waste",
]
