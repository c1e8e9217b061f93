"""Who used the box: the ledger of finished requests, budgets and their 429s, and requests in
flight counted across replicas.

May import: every package below it (``intake`` down to ``core``).
"""

from gateway.usage.budgets import BudgetState
from gateway.usage.in_flight import InFlight
from gateway.usage.ledger import Ledger
from gateway.usage.spending import Spending
from gateway.usage.stores.base import RefusalRow, StoreError, Tally, UsageRow, UsageStore
from gateway.usage.stores.redis import RedisUsage
from gateway.usage.stores.sqlite import SqliteUsage, usage_file_problem

__all__ = [
    "BudgetState",
    "InFlight",
    "Ledger",
    "RedisUsage",
    "RefusalRow",
    "Spending",
    "SqliteUsage",
    "StoreError",
    "Tally",
    "UsageRow",
    "UsageStore",
    "usage_file_problem",
]
