"""Counters and histograms kept as plain numbers, rendered as families when Prometheus scrapes.

prometheus_client's Counter and Histogram look up the child, take a lock and loop over the
buckets in Python on every call, with the label lookups: a sizeable share of the Python
the gateway spends on each request, on the path of the next request. The gateway is one
asyncio thread and scrapes run on its loop, so plain numbers in a dict need no lock. The
exposition is the one prometheus_client gives: the same families, samples, bucket bounds
and ``_created`` (when a label set was first counted, unless
``PROMETHEUS_DISABLE_CREATED_SERIES`` says not to, as it reads it). Label values must
already be bounded (``observe/labels.py``): every set is kept for good.
"""

from __future__ import annotations

import os
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["LabelValues", "LabelledCounts", "LabelledHistogram"]

LabelValues = tuple[str, ...]
"""One value per label name, in the family's order."""


def _created_series() -> bool:
    """Whether ``_created`` samples are exposed: prometheus_client's own switch."""
    setting = os.environ.get("PROMETHEUS_DISABLE_CREATED_SERIES", "False")
    return setting.lower() not in ("true", "1", "t")


class LabelledCounts(Collector):
    """A counter family: a running total per label set."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._name, self._documentation, self._labels = name, documentation, list(labels)
        self._clock = clock  # wall-clock seconds, for _created
        self._totals: dict[LabelValues, float] = {}
        self._created: dict[LabelValues, float] = {}

    def inc(self, labels: LabelValues, amount: float = 1.0) -> None:
        total = self._totals.get(labels)
        if total is None:
            self._created[labels] = self._clock()
            total = 0.0
        self._totals[labels] = total + amount

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self._name, self._documentation, labels=self._labels)
        created = self._created if _created_series() else {}
        for labels, total in self._totals.items():
            family.add_metric([str(value) for value in labels], total, created.get(labels))
        yield family


@dataclass(slots=True)
class _Series:
    counts: list[int]  # one per bucket, then +Inf; not cumulative
    created: float
    total: float = 0.0


class LabelledHistogram(Collector):
    """A histogram family: counts per bucket and a sum, per label set."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str],
        buckets: Sequence[float],
        clock: Callable[[], float] | None = time.time,
    ) -> None:
        """``clock``: wall-clock seconds, for _created; None: no _created samples."""
        self._name, self._documentation, self._labels = name, documentation, list(labels)
        self._bounds = tuple(float(bound) for bound in buckets)
        # As the client's Histogram writes them (1.0, not 1); it has no annotations.
        bounds = [floatToGoString(bound) for bound in self._bounds]  # type: ignore[no-untyped-call]
        self._les = [*bounds, "+Inf"]
        self._clock = clock
        self._series: dict[LabelValues, _Series] = {}

    def observe(self, labels: LabelValues, value: float) -> None:
        series = self._series.get(labels) or self._new(labels)
        series.counts[bisect_left(self._bounds, value)] += 1  # a bucket's bound is inclusive
        series.total += value

    def observe_all(self, labels: LabelValues, values: list[float]) -> None:
        """``observe`` of each of ``values`` (a reply's gaps, one per chunk) at once: sorted,
        then a bisect per bucket rather than per value, as a reply's gaps can far outnumber
        the buckets."""
        series = self._series.get(labels) or self._new(labels)
        ordered, counts, below = sorted(values), series.counts, 0
        for bucket, bound in enumerate(self._bounds):
            if below == len(ordered):
                break
            at = bisect_right(ordered, bound, below)
            counts[bucket] += at - below
            below = at
        counts[-1] += len(ordered) - below
        series.total += sum(values)  # in the reply's order: sorted would round differently

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._documentation, labels=self._labels)
        created = self._clock is not None and _created_series()
        for labels, series in self._series.items():
            values = [str(value) for value in labels]
            buckets = list(zip(self._les, map(float, accumulate(series.counts)), strict=True))
            family.add_metric(values, buckets, series.total)
            if created:  # after the sum, where prometheus_client's Histogram puts it
                name = self._name + "_created"
                family.add_sample(
                    name, dict(zip(self._labels, values, strict=True)), series.created
                )
        yield family

    def _new(self, labels: LabelValues) -> _Series:
        created = 0.0 if self._clock is None else self._clock()
        series = self._series[labels] = _Series([0] * (len(self._bounds) + 1), created)
        return series
