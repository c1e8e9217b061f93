"""The prefill gate: a heavy request waits for light requests on its backend, for a while."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.admission.prefill_gate import PrefillGate


class TestPrefillGate:
    def test_a_heavy_request_starts_at_once_where_no_light_request_runs(self) -> None:
        """With nothing light running, the gate is open and holds nothing."""
        gate = PrefillGate()
        assert gate.may_start("gpu", light_running=0, wait=2.0, now=10.0)
        assert gate.opens_at(2.0) is None

    def test_a_heavy_request_is_held_while_light_requests_run_then_starts_anyway(self) -> None:
        """Held from its first try; open ``wait`` seconds later though the light one still runs."""
        gate = PrefillGate()
        assert not gate.may_start("gpu", light_running=1, wait=2.0, now=10.0)
        assert not gate.may_start("gpu", light_running=2, wait=2.0, now=11.9)
        assert gate.opens_at(2.0) == 12.0
        assert gate.may_start("gpu", light_running=1, wait=2.0, now=12.0)

    def test_a_wait_of_zero_never_holds(self) -> None:
        """wait_for_light: 0 turns the gate off."""
        gate = PrefillGate()
        assert gate.may_start("gpu", light_running=3, wait=0.0, now=1.0)
        assert gate.opens_at(0.0) is None

    def test_the_next_heavy_request_is_held_afresh_after_one_started(self) -> None:
        """A start clears the hold of its backend only; clear() forgets every hold."""
        gate = PrefillGate()
        gate.may_start("gpu", light_running=1, wait=2.0, now=10.0)
        gate.may_start("cpu", light_running=1, wait=2.0, now=10.5)
        gate.started("gpu")
        assert not gate.may_start("gpu", light_running=1, wait=2.0, now=13.0)
        assert gate.may_start("cpu", light_running=1, wait=2.0, now=13.0)
        gate.clear()
        assert gate.opens_at(2.0) is None


@settings(max_examples=200, deadline=None)
@given(
    st.floats(0.0, 30.0),
    st.lists(st.tuples(st.floats(0.0, 100.0), st.integers(0, 4)), min_size=1, max_size=30),
)
def test_a_held_heavy_request_never_waits_longer_than_wait(
    wait: float, tries: list[tuple[float, int]]
) -> None:
    """Whatever light requests come and go, a try at least ``wait`` after the first hold
    succeeds, and a try with nothing light running always does."""
    gate, first_held = PrefillGate(), None
    for now, light in sorted(tries):
        allowed = gate.may_start("gpu", light, wait, now)
        if not allowed and first_held is None:
            first_held = now
        if light == 0 or (first_held is not None and now - first_held >= wait):
            assert allowed
