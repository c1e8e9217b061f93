"""Holds on capacity shared by several gateway replicas: one contract, two implementations.

``RedisHolds`` keeps them in Redis so that several replicas enforce one set of limits: a
user's cap and a backend's slots hold across all of them. ``MemoryHolds`` keeps them in
one process. A single gateway uses neither: its waiting room is its only ledger.

May import: what ``admission`` may.
"""
