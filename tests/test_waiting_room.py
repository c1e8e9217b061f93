"""The waiting room's dispatch, on its own with an injected clock: heavy starts and light ones."""

from __future__ import annotations

import asyncio
import random

from gateway.admission.room import WaitingRoom
from gateway.admission.scheduler import Candidate
from gateway.admission.slot_ledger import SlotLedger
from gateway.admission.tickets import Ticket, Waiter
from gateway.backends.pool import Backend, BackendPool, BackendStates
from gateway.config import model_key
from gateway.config.policy import parse_policy
from gateway.core.vocabulary import Api, Lane, RequestClass

POLICY = """\
classes: {{heavy: {{max_slots: 1, wait_for_light: {wait}}}}}
defaults: {{max_concurrent: 2, max_queued: 4}}
users: {{ann: {{keys: [a]}}, bob: {{keys: [b]}}, cy: {{keys: [c]}}}}
backends: [{{name: gpu, url: "http://127.0.0.1:1", kind: ollama, slots: 2}}]
"""


class Room:
    """A waiting room with a hand-moved clock that records the wake-ups it asks for."""

    def __init__(self, wait: float = 2.0) -> None:
        policy = parse_policy(POLICY.format(wait=wait))
        self.now = 100.0
        self.wakes: list[float] = []
        self.room = WaitingRoom(
            policy,
            BackendPool(policy.backends, BackendStates()),
            on_change=lambda: None,
            clock=lambda: self.now,
            wake_in=self.wakes.append,
        )

    def join(self, user: str, heavy: bool) -> Waiter:
        request_class = RequestClass.HEAVY if heavy else RequestClass.LIGHT
        ticket = Ticket(
            user, "m", Api.OLLAMA, input_tokens=3000 if heavy else 40, request_class=request_class
        )
        waiter = self.room.join(ticket, self.now, asyncio.get_running_loop().create_future())
        self.room.dispatch()
        return waiter

    def end(self, waiter: Waiter) -> None:
        backend: Backend = waiter.turn.result()
        self.room.release(waiter.ticket, backend)


async def test_a_heavy_request_starts_at_once_when_no_light_request_runs() -> None:
    """Work conservation: the gate holds heavy work only beside light work."""
    room = Room()
    assert room.join("ann", heavy=True).turn.done()
    assert room.wakes == []


async def test_a_heavy_request_waits_for_the_light_request_running_beside_it() -> None:
    """A free slot, a light request running: the heavy one waits, and starts when it ends."""
    room = Room()
    light = room.join("bob", heavy=False)
    heavy = room.join("ann", heavy=True)
    assert light.turn.done() and not heavy.turn.done()
    assert room.wakes == [2.0]  # asked to look again when the hold runs out
    room.now += 0.5
    room.end(light)
    assert heavy.turn.done()


async def test_a_held_heavy_request_starts_when_the_hold_runs_out() -> None:
    """No starvation: light requests that keep running delay it by wait_for_light at most."""
    room = Room()
    room.join("bob", heavy=False)
    heavy = room.join("ann", heavy=True)
    room.now += 1.0
    room.room.dispatch()  # something else changed: still held, asked to look in 1 s
    assert not heavy.turn.done() and room.wakes[-1] == 1.0
    room.now += 1.0
    room.room.dispatch()  # what Admission's timer does
    assert heavy.turn.done()


async def test_a_light_request_takes_the_slot_a_heavy_one_is_held_for() -> None:
    """While the heavy request is held, a light arrival starts at once in the free slot."""
    room = Room()
    room.join("bob", heavy=False)
    heavy = room.join("ann", heavy=True)
    assert room.join("cy", heavy=False).turn.done()
    assert not heavy.turn.done()


async def test_with_wait_for_light_zero_a_heavy_request_starts_beside_light_ones() -> None:
    """The gate can be turned off, and then heavy requests start as soon as a slot is free."""
    room = Room(wait=0.0)
    room.join("bob", heavy=False)
    assert room.join("ann", heavy=True).turn.done()
    assert room.wakes == []


async def test_a_hold_is_forgotten_when_the_held_request_leaves() -> None:
    """A heavy request that gave up does not shorten the hold of the next one."""
    room = Room()
    room.join("bob", heavy=False)
    first = room.join("ann", heavy=True)
    room.now += 1.5
    first.turn.cancel()
    room.room.leave(first)
    room.room.dispatch()
    room.now += 1.0
    second = room.join("ann", heavy=True)
    assert not second.turn.done()
    assert room.wakes[-1] == 2.0


def _arrive_at_once_or_join(room: Room, user: str, heavy: bool) -> Waiter:
    request_class = RequestClass.HEAVY if heavy else RequestClass.LIGHT
    ticket = Ticket(
        user, "m", Api.OLLAMA, input_tokens=3000 if heavy else 40, request_class=request_class
    )
    turn = asyncio.get_running_loop().create_future()
    started = room.room.start_at_once(ticket)
    if started is not None:  # no waiter: one standing for it, its turn done
        backend, _, weight = started
        turn.set_result(backend)
        return Waiter(ticket, Candidate(0, user, weight, ticket.input_tokens), room.now, turn)
    waiter = room.room.join(ticket, room.now, turn)
    room.room.dispatch()
    return waiter


def _state(room: Room) -> tuple[object, ...]:
    inner = room.room
    return (
        inner.ordering.counters(),
        dict(inner.busy),
        dict(inner.slots.heavy),
        dict(inner.running),
        inner.depth,
        sorted((t.user, name, since) for t, name, since in inner.slots.holders.values()),
        list(room.wakes),
    )


async def test_starting_at_once_leaves_the_room_as_joining_and_dispatching_does() -> None:
    """The quick yes is a shortcut, not a policy: charges, lifts, slots and holds agree step
    by step with the queue's path over a run of arrivals and ends."""
    queued, quick = Room(), Room()
    steps = [("ann", False), ("bob", True), ("end", 0), ("cy", False), ("ann", True)]
    steps += [("end", 1), ("end", 0), ("bob", False), ("cy", True), ("end", 0), ("end", 0)]
    running: dict[int, list[Waiter]] = {id(queued): [], id(quick): []}
    for who, what in steps:
        for room in (queued, quick):
            room.now += 0.25
            mine = running[id(room)]
            if who == "end":
                started = [waiter for waiter in mine if waiter.turn.done()]
                room.end(started[int(what)])
                mine.remove(started[int(what)])
            elif room is queued:
                mine.append(room.join(who, heavy=bool(what)))
            else:
                mine.append(_arrive_at_once_or_join(room, who, heavy=bool(what)))
        assert _state(quick) == _state(queued)
        started_queued = [w.turn.done() for w in running[id(queued)]]
        assert [w.turn.done() for w in running[id(quick)]] == started_queued


async def test_nobody_starts_at_once_past_a_request_that_waits() -> None:
    """With a request waiting, an arrival goes through the queue even if a slot is free:
    the ordering, not arrival, picks who takes it."""
    room = Room()
    room.join("bob", heavy=False)
    held = room.join("ann", heavy=True)  # held for the light request beside it
    assert not held.turn.done()
    ticket = Ticket("cy", "m", Api.OLLAMA, input_tokens=40)
    assert room.room.start_at_once(ticket) is None
    assert room.room.depth == 1


async def test_background_work_beside_does_not_hold_a_persons_heavy_request() -> None:
    """The gate keeps a long prefill off people's streams: a title task (light, in the
    background lane) running on the backend does not hold a person's long prompt."""
    room = Room()
    task = Ticket(
        "bob",
        "m",
        Api.OLLAMA,
        input_tokens=40,
        request_class=RequestClass.LIGHT,
        lane=Lane.BACKGROUND,
    )
    running = room.room.join(task, room.now, asyncio.get_running_loop().create_future())
    room.room.dispatch()
    assert running.turn.done()
    assert room.join("ann", heavy=True).turn.done()
    assert room.wakes == []


async def test_a_backends_running_count_agrees_with_its_slot_groups_at_every_step() -> None:
    """The quick yes reads one running count per backend: through starts and ends of
    several models on Ollama and on llama.cpp, it is the sum of the backend's slot groups."""
    policy = parse_policy(
        "backends:\n"
        '  - {name: ol, url: "http://127.0.0.1:1", kind: ollama, slots: 2}\n'
        '  - {name: ll, url: "http://127.0.0.1:2", kind: llamacpp, slots: 2}\n'
    )
    backends = BackendPool(policy.backends, BackendStates()).backends
    ledger = SlotLedger()
    chooser = random.Random(7)
    running: list[tuple[Ticket, Backend]] = []
    for _ in range(300):
        if running and chooser.random() < 0.45:
            ticket, backend = running.pop(chooser.randrange(len(running)))
            ledger.give_back(ticket, backend)
        else:
            model = chooser.choice(["m1", "m2", "M1:latest", "m3"])
            heavy = RequestClass.HEAVY if chooser.random() < 0.3 else RequestClass.LIGHT
            ticket = Ticket("ann", model, Api.OLLAMA, input_tokens=40, request_class=heavy)
            backend = chooser.choice(backends)
            ledger.take(ticket, backend)
            running.append((ticket, backend))
        for backend in backends:
            groups = sum(n for group, n in ledger.busy.items() if group.startswith(backend.key))
            assert ledger.busy_on(backend) == groups
            assert groups == sum(1 for _, b in running if b is backend)


async def test_a_backend_marked_down_or_no_longer_listing_the_model_is_no_longer_chosen() -> None:
    """Who serves a model is remembered between requests, but not past a probe that changes it."""
    room = Room().room
    ticket = Ticket("ann", "m", Api.OLLAMA, input_tokens=40)
    (gpu,) = room.pool.backends
    assert room.free_backends(ticket) == [gpu]
    gpu.state.healthy = False  # as the monitor writes it, in place
    assert room.free_backends(ticket) == []
    gpu.state.healthy = True
    assert room.free_backends(ticket) == [gpu]
    gpu.state.models = frozenset({"other"})
    assert room.free_backends(ticket) == []
    assert room.start_at_once(ticket) is None


async def test_a_reload_that_changes_a_cost_keeps_who_has_had_how_much() -> None:
    """The fair counters outlive a reload that changes the costs, whether the scheduler
    reads the changed one (input) or not (load): a new price is no fresh start for
    everyone, which would hand the heaviest user's backlog the front of the line."""
    room = Room()
    room.end(room.join("ann", heavy=True))  # 3,000 prompt tokens charged to ann
    before = dict(room.room.ordering.counters())
    assert before["ann"] > 0
    for costs in ("{load: 10}", "{input: 2.0}"):
        policy = parse_policy(POLICY.format(wait=2.0) + f"costs: {costs}\n")
        room.room.reconfigure(policy, room.room.pool)
        assert dict(room.room.ordering.counters()) == before


async def test_a_task_that_ran_a_model_makes_nobody_its_user() -> None:
    """A person's request that ends makes them a user of its model (the swaps ration who
    may unload it); a task's makes nobody one: it keeps no model from a person."""
    room = Room()
    task = Ticket("bob", "m", Api.OLLAMA, input_tokens=40, lane=Lane.BACKGROUND)
    running = room.room.join(task, room.now, asyncio.get_running_loop().create_future())
    room.room.dispatch()
    room.room.release(task, running.turn.result())
    person = room.join("ann", heavy=False)
    room.end(person)
    [backend] = room.room.pool.backends
    assert list(room.room.swaps.plans_of(backend).users[model_key("m")]) == ["ann"]
