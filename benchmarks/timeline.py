"""Where one request's time to first token goes: its way in and its way back.

The client (``wire_client --timeline``) stamps when it sent each request and when its first
line came; the stub (``wire_stub``'s ``GET /stamps``) when it read each request and when it
began to answer. Both read ``time.perf_counter``, the system's monotonic clock, so the
stamps of the two processes compare. Direct, a request's way in is the client's send to the
stub's read; through a relay it also holds the relay's work on the request and one more
wake-up of a process on another core, and so does the way back. TTFT is the way in, the
stub's own moment, and the way back; what a relay adds to TTFT, split in two.
"""

from __future__ import annotations

import json
import statistics
import urllib.request
from collections.abc import Sequence

__all__ = ["Ways", "stub_stamps", "ways"]

Ways = tuple[float, float]  # way in, way back: medians, seconds


def stub_stamps(stub_url: str) -> list[tuple[float, float]]:
    """The stub's (read, answered) stamps since it was last asked, which it then forgets."""
    with urllib.request.urlopen(stub_url + "/stamps", timeout=10) as reply:
        return [(read, answered) for read, answered in json.load(reply)]


def ways(sends: Sequence[Sequence[float]], stamps: Sequence[tuple[float, float]]) -> Ways | None:
    """The median way in and way back of the client's counted requests (one at a time:
    each one's stub stamps are those read between its send and its first line); None if
    none of them pairs."""
    way_in, way_back = [], []
    stamps = sorted(stamps)
    at = 0
    for sent, first in sorted(map(tuple, sends)):
        while at < len(stamps) and stamps[at][0] < sent:
            at += 1
        if at < len(stamps) and stamps[at][0] <= first:
            read, answered = stamps[at]
            way_in.append(read - sent)
            way_back.append(first - answered)
    if not way_in:
        return None
    return statistics.median(way_in), statistics.median(way_back)
