"""The values a Prometheus label may take: bounded by the policy, whatever clients send.

Prometheus keeps every series it scraped for its retention (30 days in ``deploy/``), and
this process every label set it counted, so a value a client makes up (a person's address,
a model name) would cost memory and disk on both sides per request. A user label is a
configured name, ``anonymous``, or ``unknown`` (an unknown key, a user removed by a
reload); a person a front end names (``owui/alice@example.com``) counts under the front
end. A model label is one a backend lists or keeps warm, else ``other``.
Per-person detail stays where it belongs: /status and the house page (the people in the
room now), the usage store.

One vocabulary for the per-request counters and the gauges read from the snapshot, so
that ``sum by (user)`` means the same thing in every panel.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gateway.backends import model_key
from gateway.reload import LivePolicy
from gateway.user_policy import ANONYMOUS, UNKNOWN

__all__ = ["OTHER", "MetricLabels", "add_merged"]

OTHER = "other"
"""The model label of a model no backend lists and none keeps warm."""

Sample = tuple[tuple[str, ...], float]
Family = CounterMetricFamily | GaugeMetricFamily


class MetricLabels:
    """Maps users and models to their label values, against the policy in force now."""

    def __init__(self, policy: LivePolicy) -> None:
        self._policy = policy

    def user(self, user: str | None) -> str:
        # Not anonymous: that is a user of its own, and 401s from a stranger's key counted
        # under it would read as the household's keyless devices failing.
        if user is None:
            return UNKNOWN
        if user == ANONYMOUS:
            return ANONYMOUS
        policy = self._policy.current.policy
        # A person a front end names counts under the front end: labels stay bounded.
        account = policy.account_of(user)
        return account if account in policy.users else UNKNOWN

    def model(self, model: str) -> str:
        key, view = model_key(model), self._policy.current
        listed = any(key in (b.state.models or ()) for b in view.pool.backends)
        kept_warm = any(key in map(model_key, b.keep_warm) for b in view.policy.backends)
        return model if listed or kept_warm else OTHER


def add_merged(
    family: Family,
    samples: Iterable[Sample],
    combine: Callable[[float, float], float] = operator.add,
) -> None:
    """Add ``samples`` to ``family``, those whose label values became the same (two people
    of one front end, two made-up models) as one: added up, or as ``combine`` says."""
    found: dict[tuple[str, ...], float] = {}
    for labels, value in samples:
        before = found.get(labels)
        found[labels] = value if before is None else combine(before, value)
    for labels, value in found.items():
        family.add_metric(labels, value)
