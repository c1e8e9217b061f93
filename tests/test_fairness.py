"""End to end on the simulator: a heavy user's flood cannot starve the light users."""

from __future__ import annotations

from dataclasses import replace

from benchmarks.fairness import FLOOD, REFERENCE, SIM, compare
from benchmarks.household import p95
from tests.conftest import StartGateway, StartSim
from tests.test_admission import USERS, held, policy, until, waiting_chat


async def test_fair_keeps_light_users_near_the_reference_where_fifo_does_not() -> None:
    """Light users' p95 TTFT: within 1.5x of the direct reference with fair, far worse with fifo."""
    # Twice the simulator's speed and half the chats of the benchmark, to keep it short;
    # the shape of the household is the same.
    sim = replace(SIM, prefill_tokens_per_s=40_000.0, decode_tokens_per_s=200.0)
    reference_run, fifo_run, fair_run = await compare(
        replace(FLOOD, light_chats=4), replace(REFERENCE, light_chats=4), sim
    )
    reference = p95(reference_run.light_ttft())
    fifo, fair = p95(fifo_run.light_ttft()), p95(fair_run.light_ttft())
    assert fair <= 1.5 * reference, (fair, reference)
    assert fifo >= 2.0 * fair, (fifo, fair)
    assert fair_run.max_running <= 2 and fifo_run.max_running <= 2
    heavy = next(o for o in fair_run.outcomes if o.request_class == "heavy")
    assert heavy.tokens > 0 and heavy.failed == 0  # slowed, not starved


async def test_a_heavy_request_held_beside_a_light_one_starts_when_the_hold_runs_out(
    start_sim: StartSim, start_gateway: StartGateway
) -> None:
    """A free slot and a light request running: the heavy request waits, then its timer
    starts it though the light request still runs."""
    _, sim_url = await start_sim(parallel=2)
    gateway = await start_gateway(
        policy(
            sim_url,
            slots=2,
            head="classes: {heavy: {min_prompt_tokens: 100, max_slots: 1, "
            "wait_for_light: 300ms}}\n" + USERS,
        )
    )
    admission = gateway.services.admission
    async with held(gateway, "bob-key", "a light question"):
        heavy = waiting_chat(gateway, "alice-key", "summarise " * 100)
        await until(admission, lambda snap: snap.queue_depth == 1 and snap.backends["sim"][0] == 1)
        await until(admission, lambda snap: snap.heavy_running.get("sim") == 1)
        reply = await heavy
    assert reply.done
