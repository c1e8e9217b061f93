"""The values a Prometheus label may take: bounded by the policy, whatever clients send.

Prometheus keeps every series it scraped for its retention (30 days in ``deploy/``), and
this process every label set it counted, so a value a client makes up (a person's address,
a model name) would cost memory and disk on both sides per request. A user label is a
configured name, ``anonymous``, or ``unknown`` (an unknown key, a user removed by a
reload); a person a front end names (``owui/alice@example.com``) counts under the front
end. A model label is one a backend lists or keeps warm, spelt as Ollama lists it
(``llama3.2:latest``, however a client wrote it), else ``other``.
Per-person detail stays where it belongs: /status and the house page (the people in the
room now), the usage store.

One vocabulary for the per-request counters and the gauges read from the snapshot, so
that ``sum by (user)`` means the same thing in every panel.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gateway.backends import BackendState
from gateway.config import ANONYMOUS, UNKNOWN, model_key
from gateway.reload import LivePolicy, PolicyView

__all__ = ["OTHER", "MetricLabels", "add_merged"]

OTHER = "other"
"""The model label of a model no backend lists and none keeps warm."""

Sample = tuple[tuple[str, ...], float]
Family = CounterMetricFamily | GaugeMetricFamily


class MetricLabels:
    """Maps users and models to their label values, against the policy in force now.

    Every finished request asks for both, so what the answers rest on is worked out once
    per policy version and per change of a backend's model list, and checked by identity
    (a reload replaces the view, a probe the list). Only configured names are remembered:
    the names clients make up are what a bound must not grow with.
    """

    def __init__(self, policy: LivePolicy) -> None:
        self._policy = policy
        self._view: PolicyView | None = None
        self._users: dict[str, str] = {}  # label of each configured user (and anonymous)
        self._states: list[BackendState] = []  # of the view's backends
        self._lists: list[frozenset[str] | None] = []  # their model lists, as last seen
        self._models: frozenset[str] = frozenset()  # keys listed or kept warm

    def user(self, user: str | None) -> str:
        # Not anonymous: that is a user of its own, and 401s from a stranger's key counted
        # under it would read as the household's keyless devices failing.
        if user is None:
            return UNKNOWN
        view = self._current()
        label = self._users.get(user)
        return self._account(view, user) if label is None else label

    def model(self, model: str) -> str:
        view = self._current()
        lists = list(map(_MODELS, self._states))
        if lists != self._lists:
            self._models = _models(view, lists)
        # A probe replaces a list, mostly with an equal one: keeping the newest lets the
        # next comparison end at identity, as list comparison tries that first.
        self._lists = lists
        # One spelling per model, Ollama's (``llama3.2`` is ``llama3.2:latest``): a
        # dashboard's series for a model does not split by how each client wrote it.
        key = model_key(model)
        return key if key in self._models else OTHER

    def _current(self) -> PolicyView:
        view = self._policy.current
        if view is not self._view:
            self._view = view
            configured = {name: self._account(view, name) for name in view.policy.users}
            self._users = {**configured, ANONYMOUS: ANONYMOUS}
            self._states = [backend.state for backend in view.pool.backends]
            self._lists = list(map(_MODELS, self._states))
            self._models = _models(view, self._lists)
        return view

    @staticmethod
    def _account(view: PolicyView, user: str) -> str:
        if user == ANONYMOUS:
            return ANONYMOUS
        policy = view.policy
        # A person a front end names counts under the front end: labels stay bounded.
        account = policy.account_of(user)
        return account if account in policy.users else UNKNOWN


_MODELS = operator.attrgetter("models")


def _models(view: PolicyView, lists: list[frozenset[str] | None]) -> frozenset[str]:
    """The model keys that are their own label value: listed by a backend or kept warm."""
    kept_warm = (model_key(model) for b in view.policy.backends for model in b.keep_warm)
    return frozenset().union(*(listed for listed in lists if listed), kept_warm)


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
