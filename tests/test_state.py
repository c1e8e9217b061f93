"""The shared-state contract, run against both implementations, and Redis's leases."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.admission.holds.base import Hold, HoldStore, Place, StoreUnavailable
from gateway.admission.holds.memory import MemoryHolds
from gateway.admission.holds.redis import RedisHolds, _held_keys
from gateway.admission.holds.redis_house import GONE, PLACES, WAITING, place_json, queued_key
from gateway.core import Lane, connect
from tests.redis_server import RedisServer, redis_server, redis_url  # noqa: F401 (fixtures)


@pytest.fixture(params=["memory", "redis"])
async def state(
    request: pytest.FixtureRequest,
    redis_url: str,  # noqa: F811
) -> AsyncIterator[HoldStore]:
    if request.param == "memory":
        yield MemoryHolds()
        return
    shared = RedisHolds(redis_url, lease_seconds=5.0)
    shared.start()
    yield shared
    await shared.close()


def hold(n: int, user: str = "alice", backend: str = "gpu", **limits: int | bool) -> Hold:
    fields: dict[str, int | bool] = {"user_cap": 2, "slots": 3, "heavy_slots": 1}
    fields.update(limits)
    return Hold(f"h{n}", user, backend=backend, **fields)  # type: ignore[arg-type]


class TestContract:
    async def test_holds_are_taken_up_to_the_users_cap(self, state: HoldStore) -> None:
        """A user's third hold is refused at a cap of two; another user's is not."""
        assert await state.take(hold(1))
        assert await state.take(hold(2))
        assert not await state.take(hold(3))
        assert await state.take(hold(4, user="bob"))
        assert await state.usage() == ({"alice": 2, "bob": 1}, {"gpu": 3})

    async def test_holds_are_taken_up_to_the_backends_slots(self, state: HoldStore) -> None:
        """With every slot held, even a user under their cap is refused."""
        for n, user in enumerate(["a", "b", "c"]):
            assert await state.take(hold(n, user=user))
        assert not await state.take(hold(9, user="d"))
        assert await state.take(hold(10, user="d", backend="other"))

    async def test_a_front_ends_people_together_are_held_to_its_total(
        self, state: HoldStore
    ) -> None:
        """Two people of owui, each under their own cap, with a total of one: the second is
        refused while the first runs, takes it once the first is given back; someone else
        is not held to it."""
        ann = hold(1, user="owui/ann", together="owui/(all)", together_cap=1)
        bea = hold(2, user="owui/bea", together="owui/(all)", together_cap=1)
        assert await state.take(ann)
        assert not await state.take(bea)
        assert await state.take(hold(3, user="bob"))
        state.give_back(ann)
        async with asyncio.timeout(5):  # Redis's release runs in the background
            while not await state.take(bea):
                await state.released(within=0.1)

    async def test_a_hold_given_back_now_is_not_counted_by_the_next_take(
        self, state: HoldStore
    ) -> None:
        """A request moving to another backend (its first failed): its hold given back,
        the new one is taken next, at its user's cap and its front end's total alike."""
        old = hold(1, user="owui/ann", user_cap=1, together="owui/(all)", together_cap=1)
        assert await state.take(old)
        await state.give_back_now(old)
        assert await state.take(replace(old, id="h2", backend="gpu2"))

    async def test_heavy_holds_are_limited_to_their_share(self, state: HoldStore) -> None:
        """With heavy_slots 1, a second heavy hold is refused while a light one is not."""
        assert await state.take(hold(1, user="a", heavy=True))
        assert not await state.take(hold(2, user="b", heavy=True))
        assert await state.take(hold(3, user="b"))

    async def test_giving_back_frees_the_room_and_wakes_waiters(self, state: HoldStore) -> None:
        """A release makes room again and ends a wait on released() early."""
        first = hold(1, user_cap=1)
        assert await state.take(first)
        assert not await state.take(hold(2, user_cap=1))
        waiting = asyncio.create_task(state.released(within=5))
        await asyncio.sleep(0)  # let the waiter start waiting
        state.give_back(first)
        started = time.monotonic()
        await waiting
        assert time.monotonic() - started < 2
        assert await state.take(hold(2, user_cap=1))

    async def test_taking_the_same_hold_twice_counts_once(self, state: HoldStore) -> None:
        """take() is idempotent for one hold id."""
        assert await state.take(hold(1, user_cap=1))
        assert await state.take(hold(1, user_cap=1))
        assert (await state.usage())[0] == {"alice": 1}

    async def test_requests_in_flight_are_counted_up_to_the_room_left_once_each(
        self, state: HoldStore
    ) -> None:
        """A user's third request is not counted with room for two; a repeat counts once;
        another user's has room of its own; an ended one makes room again."""
        assert await state.count_in_flight("alice", "r1", 2)
        assert await state.count_in_flight("alice", "r1", 2)  # the same request: still one
        assert await state.count_in_flight("alice", "r2", 2)
        assert not await state.count_in_flight("alice", "r3", 2)
        assert await state.count_in_flight("bob", "r4", 2)
        state.uncount_in_flight("alice", "r1")
        # At once, though Redis forgets it in the background: by now it counts as used.
        assert await state.count_in_flight("alice", "r3", 2)

    async def test_giving_back_everything_leaves_nothing(self, state: HoldStore) -> None:
        """After every hold is released, usage is empty."""
        holds = [hold(n, user=f"u{n}") for n in range(3)]
        for each in holds:
            assert await state.take(each)
        for each in holds:
            state.give_back(each)
        await _settled(state)
        assert await state.usage() == ({}, {})


def place(
    n: int, rank: float, user: str = "alice", lane: Lane = Lane.INTERACTIVE, **fields: object
) -> Place:
    """A waiting request's place, served by the backend ``gpu``, its user's cap 2. Its
    ``rank`` is its cost: the n-th to join, each of another payer, ends ranked ``rank``
    (the house's clock stays at 0 while nothing starts)."""
    values: dict[str, object] = {"cap": 2, "heavy": False, "groups": ("gpu",)}
    values.update(fields)
    return Place(
        f"p{n}",
        user,
        lane=lane,
        payer=f"{user}/{lane}",
        cost=rank,
        arrived=float(n),
        user=user,
        model="m",
        **values,  # type: ignore[arg-type]
    )


def placed(n: int, where: Place, **limits: int | bool) -> Hold:
    """The hold that ``where``'s request asks for."""
    fields: dict[str, int | bool] = {"user_cap": where.cap, "slots": 2, "heavy_slots": 1}
    fields.update(limits)
    return Hold(f"h{n}", where.holder, backend="gpu", place=where, **fields)  # type: ignore[arg-type]


class TestTheHousesWaitingRoom:
    """One waiting room across replicas: its bounds, and no request passed over."""

    async def test_a_place_ahead_that_asks_holds_back_a_take_behind_it(
        self, state: HoldStore
    ) -> None:
        """A slot frees: bob (ranked behind) may not take it while alice asks for it."""
        carol, dan = hold(0, user="carol", slots=2), hold(9, user="dan", slots=2)
        assert await state.take(carol) and await state.take(dan)
        first, second = place(1, rank=10.0), place(2, rank=20.0, user="bob")
        assert isinstance(await state.join(first, 4, 8), Place)
        assert isinstance(await state.join(second, 4, 8), Place)
        assert not await state.take(placed(1, first))  # full: now she asks for gpu
        state.give_back(dan)
        await _running_on_gpu(state, 1)
        assert not await state.take(placed(2, second))
        assert await state.take(placed(1, first))  # and alice's place leaves the room
        state.give_back(carol)
        await _running_on_gpu(state, 1)  # alice's
        assert await state.take(placed(3, second))

    async def test_a_place_ahead_that_could_not_take_the_slot_holds_nobody_back(
        self, state: HoldStore
    ) -> None:
        """Ahead and asking, but at their cap, asking for another backend, or heavy with
        the heavy share full: none of them keeps bob waiting for a slot they could not use."""
        assert await state.take(hold(0, user="alice", user_cap=1, heavy=True))
        assert await state.take(hold(8, user="zed", backend="elsewhere", slots=1))
        alice = place(1, rank=1.0, cap=1)  # at her cap of one
        dan = place(2, rank=2.0, user="dan", groups=("gpu", "elsewhere"))
        eve = place(3, rank=3.0, user="eve", heavy=True)  # the one heavy slot is taken
        bob = place(4, rank=4.0, user="bob")
        for each in (alice, dan, eve, bob):
            assert isinstance(await state.join(each, 4, 8), Place)
        assert not await state.take(placed(1, alice, slots=3))
        assert not await state.take(replace(placed(2, dan), backend="elsewhere", slots=1))
        assert not await state.take(placed(3, eve, slots=3, heavy=True))
        assert await state.take(placed(4, bob, slots=3))

    async def test_a_place_ahead_is_judged_by_its_caps_as_they_are_now(
        self, state: HoldStore
    ) -> None:
        """A reload lowered alice's cap from two, as her place joined, to one: once she asks
        under it (her one running, refused), she holds back nobody behind her for a slot
        she could not take."""
        assert await state.take(hold(0, user="alice"))
        alice, bob = place(1, rank=1.0), place(2, rank=2.0, user="bob")
        for each in (alice, bob):
            assert isinstance(await state.join(each, 4, 8), Place)
        assert not await state.take(placed(1, alice, user_cap=1, slots=3))
        assert await state.take(placed(2, bob, slots=3))

    async def test_under_fifo_the_earlier_of_two_arrivals_a_hair_apart_goes_first(
        self, state: HoldStore
    ) -> None:
        """Cost 0, the same tag: arrival decides, compared as every replica reads it, so
        two requests 30 us apart on the wall clock never each wait for the other (Redis
        keeps 14 digits: both read back as ...0.1234, each before the other's own)."""
        carol = hold(0, user="carol", slots=1)
        assert await state.take(carol)
        early = replace(place(1, 0.0), arrived=1733480000.12341)
        late = replace(place(2, 0.0, user="bob"), arrived=1733480000.12344)
        for each in (early, late):
            assert isinstance(await state.join(each, 4, 8), Place)
            assert not await state.take(placed(int(each.id[1:]), each, slots=1))  # it asks
        state.give_back(carol)
        await _running_on_gpu(state, 0)
        assert not await state.take(placed(2, late, slots=1))
        assert await state.take(placed(1, early, slots=1))

    async def test_a_long_prompt_waits_for_peoples_light_requests_on_any_replica(
        self, state: HoldStore
    ) -> None:
        """The prefill gate, house-wide: while a person's light request runs, a heavy hold
        that has not waited wait_for_light is refused, and its place holds nobody back;
        once it has waited, or the light request ended, it goes."""
        chat = replace(hold(0, user="carol", slots=3), light=True)
        assert await state.take(chat)
        heavy = place(1, rank=1.0, user="bob", heavy=True)
        assert isinstance(await state.join(heavy, 4, 8), Place)
        early = replace(placed(1, heavy, slots=3, heavy=True), prefill_may_start=False)
        assert not await state.take(early)
        assert await state.take(placed(2, place(2, rank=2.0, user="dan"), slots=3))
        assert await state.take(replace(early, id="h3", prefill_may_start=True))
        state.give_back(chat)
        await _running_on_gpu(state, 2)
        assert await state.take(
            replace(
                placed(4, place(4, 3.0, user="eve", heavy=True), slots=4, heavy=True),
                heavy_slots=2,
                prefill_may_start=False,
            )
        )

    async def test_people_go_before_background_work_whatever_its_rank(
        self, state: HoldStore
    ) -> None:
        """A task ranked far ahead, asking, does not hold back a person's request."""
        carol = hold(0, user="carol", slots=1)
        assert await state.take(carol)
        task = place(1, rank=0.0, user="owui", lane=Lane.BACKGROUND)
        person = place(2, rank=1000.0, user="bob")
        assert isinstance(await state.join(task, 4, 8), Place)
        assert isinstance(await state.join(person, 4, 8), Place)
        assert not await state.take(placed(1, task, slots=1))  # full: it asks
        state.give_back(carol)
        await _running_on_gpu(state, 0)
        assert await state.take(placed(2, person, slots=1))

    async def test_finish_tags_follow_each_payer_and_the_houses_clock(
        self, state: HoldStore
    ) -> None:
        """A payer's places queue behind each other; a newcomer starts at the clock (the
        tag of the last request started), not at zero; output pushes a payer back."""

        async def tag(n: int, cost: float, user: str) -> float:
            joined = await state.join(place(n, cost, user=user), 8, 8)
            assert isinstance(joined, Place)
            return joined.rank

        assert await tag(1, 10.0, "alice") == 10.0
        assert await tag(2, 10.0, "alice") == 20.0  # behind her first
        bob = place(3, 5.0, user="bob")
        assert await tag(3, 5.0, "bob") == 5.0
        assert await state.take(placed(3, bob, slots=3))  # the clock moves to 5
        assert await tag(4, 1.0, "carol") == 6.0
        await state.exchange({}, {"dan/interactive": 100.0})
        assert await tag(5, 1.0, "dan") == 101.0

    async def test_a_users_places_and_the_house_are_bounded_everywhere(
        self, state: HoldStore
    ) -> None:
        """max_queued counts a holder's places in the whole house, max_depth every place;
        a place that leaves makes room, and joining twice is one place."""
        assert isinstance(await state.join(place(1, 1.0), 2, 3), Place)
        assert isinstance(await state.join(place(1, 1.0), 2, 3), Place)  # the same place again
        assert isinstance(await state.join(place(2, 2.0), 2, 3), Place)
        assert await state.join(place(3, 3.0), 2, 3) == "user"
        assert isinstance(await state.join(place(4, 4.0, user="bob"), 2, 3), Place)
        assert await state.join(place(5, 5.0, user="carol"), 2, 3) == "house"
        state.leave(place(2, 2.0))
        async with asyncio.timeout(5):  # Redis's leave runs in the background
            while await state.join(place(3, 3.0), 2, 3) == "user":
                await state.released(within=0.1)

    async def test_a_front_ends_people_wait_together_up_to_its_total(
        self, state: HoldStore
    ) -> None:
        """A total of one waiting: a second person of owui may not wait beside the first,
        wherever they came in; and one ahead who could not start for the total (its people
        run all it allows) holds nobody else back."""
        assert await state.take(hold(0, user="owui/ann", together="owui/(all)", together_cap=1))
        together = {"together": "owui/(all)", "together_cap": 1, "together_queued": 1}
        bea, cleo = (
            place(1, 1.0, user="owui/bea", **together),
            place(2, 2.0, user="owui/cleo", **together),
        )
        assert isinstance(await state.join(bea, 2, 8), Place)
        assert await state.join(cleo, 2, 8) == "user"
        assert not await state.take(placed(1, bea, together="owui/(all)", together_cap=1))
        bob = place(3, 3.0, user="bob")
        assert isinstance(await state.join(bob, 2, 8), Place)
        assert await state.take(placed(3, bob))  # bea asks, but her people hold their one


async def _running_on_gpu(state: HoldStore, count: int) -> None:
    """Until the store counts ``count`` holds on ``gpu`` (Redis releases in the background)."""
    async with asyncio.timeout(5):
        while (await state.usage())[1].get("gpu", 0) != count:
            await state.released(within=0.1)


async def _settled(state: HoldStore) -> None:
    """Redis releases in the background; wait until its usage shows it (bounded)."""
    deadline = time.monotonic() + 5
    while await state.usage() != ({}, {}) and time.monotonic() < deadline:
        await state.released(within=0.1)


class TestRedisLeases:
    async def test_a_lease_not_renewed_expires(self, redis_url: str) -> None:  # noqa: F811
        """A replica that stops renewing (killed) loses its holds within the lease time."""
        # 4 s: long enough that the survivor sees the hold still there even on a machine
        # busy enough to take seconds between the two takes (0.5 s was not, under load, and
        # 2 s was not once, with two suites sharing the machine's two cores).
        crashed = RedisHolds(redis_url, lease_seconds=4.0)
        crashed.start()
        assert await crashed.count_in_flight("alice", "r1", 1)
        assert await crashed.take(hold(1, user_cap=1))
        await crashed.close()  # renewal stops and nothing is given back, as after SIGKILL
        survivor = RedisHolds(redis_url, lease_seconds=5.0)
        survivor.start()
        try:
            assert not await survivor.take(hold(2, user_cap=1))
            assert not await survivor.count_in_flight("alice", "r2", 1)
            deadline = time.monotonic() + 10
            while not await survivor.take(hold(2, user_cap=1)):
                assert time.monotonic() < deadline, "the dead replica's lease never expired"
                await survivor.released(within=0.1)
            while not await survivor.count_in_flight("alice", "r2", 1):  # counted before it
                assert time.monotonic() < deadline, "the dead replica's count never expired"
                await survivor.released(within=0.1)
        finally:
            await survivor.close()

    async def test_renewed_leases_outlive_their_lifetime(self, redis_url: str) -> None:  # noqa: F811
        """A live replica's hold survives several lease periods."""
        # Renewed every 0.2 s: a loop held up by a busy machine (the suite shares two
        # cores with a browser and llama-server) may miss one renewal without losing it.
        live = RedisHolds(redis_url, lease_seconds=0.6)
        live.start()
        try:
            assert await live.take(hold(1, user_cap=1))
            assert await live.count_in_flight("alice", "r1", 1)
            await asyncio.sleep(2.0)  # time passing is the test: over three lease periods
            assert (await live.usage())[0] == {"alice": 1}
            assert not await live.count_in_flight("alice", "r2", 1)  # r1 still counted
        finally:
            await live.close()

    async def test_a_place_being_taken_is_not_written_back_by_a_renewal(
        self,
        redis_url: str,  # noqa: F811
    ) -> None:
        """The lease loop may reach a waiting place while its TAKE is in flight: renewed
        then, the place would come back after the take removed it, a place nobody takes for
        a lease, first in line, its user's max_queued taken."""
        holds = RedisHolds(redis_url, lease_seconds=12.0)
        try:
            for n in range(10):  # a user each: what one leaves goes in the background
                user = f"u{n}"
                joined = await holds.join(place(2 * n, 1.0, user), max_queued=1, max_depth=32)
                assert isinstance(joined, Place)
                # The take first: its script is sent before the renewal's.
                taken = placed(n, joined, slots=10)
                took, _ = await asyncio.gather(holds.take(taken), holds._renew_all())
                assert took
                assert joined.id not in {p.id for p in (await holds._house.read()).waiting}
                # Her max_queued (1) is free again: her next request may wait (elsewhere,
                # so as not to stand ahead of the next user's).
                again = place(2 * n + 1, 1.0, user, groups=("cpu",))
                assert isinstance(await holds.join(again, 1, 32), Place)
        finally:
            await holds.close()

    async def test_a_renewal_run_after_its_places_take_or_leave_writes_nothing_back(
        self,
        redis_url: str,  # noqa: F811
    ) -> None:
        """A renewal sent before a place's TAKE (or LEAVE), on another connection, may run
        after it in Redis: the place it would write back is gone, and stays gone."""
        holds = RedisHolds(redis_url, lease_seconds=12.0)
        house = holds._house
        try:
            taken = await holds.join(place(1, 1.0, "ann"), max_queued=1, max_depth=32)
            left = await holds.join(place(2, 1.0, "bea", groups=("cpu",)), 1, 32)
            assert isinstance(taken, Place) and isinstance(left, Place)
            assert await holds.take(placed(1, taken))
            assert await house.leave(left, "fairgate:released")
            for gone in (taken, left):  # what the racing renewal would have run
                keys = [WAITING, queued_key(gone.holder), PLACES, GONE]
                await house._renew(keys=keys, args=[gone.id, 12000, place_json(gone)])
            assert (await house.read()).waiting == ()
            assert isinstance(await holds.join(place(3, 1.0, "bea"), 1, 32), Place)
            # A take given back (its permit preempted meanwhile) and the same place joined
            # again: alive, so its renewals count (not gone for a lease).
            back = await holds.join(replace(taken, rank=0.0), 1, 32)
            assert isinstance(back, Place)
            keys = [WAITING, queued_key(back.holder), PLACES, GONE]
            assert await house._renew(keys=keys, args=[back.id, 12000, place_json(back)]) == 1
        finally:
            await holds.close()

    async def test_a_renewal_run_after_its_holds_release_writes_nothing_back(
        self,
        redis_url: str,  # noqa: F811
    ) -> None:
        """A renewal sent before a hold's RELEASE, on another connection, may run after it:
        written back, the hold would count against its user's cap and its backend's slots
        for a lease, running nowhere."""
        holds = RedisHolds(redis_url, lease_seconds=12.0)
        try:
            first = hold(1, user_cap=1)
            assert await holds.take(first)
            member = holds._mine[first.id][1]
            await holds.give_back_now(first)
            args = [first.id, 12000, 0, member, 0]  # what the racing renewal would have run
            assert await holds._renew(keys=_held_keys(first), args=args) == 0
            assert await holds.take(hold(2, user_cap=1))  # her cap is free
            assert (await holds.usage())[0] == {"alice": 1}
        finally:
            await holds.close()

    async def test_a_redis_that_does_not_answer_is_asked_once(self) -> None:
        """A frozen Redis (connections taken, nothing answered): a command fails after one
        timeout, on one connection, rather than again on a second (each request would wait
        twice as long before the gateway goes on without Redis)."""
        accepted: list[asyncio.StreamWriter] = []

        async def frozen(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)  # read nothing, answer nothing

        server = await asyncio.start_server(frozen, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = connect(f"redis://127.0.0.1:{port}")
        try:
            with pytest.raises(RedisTimeoutError):
                await client.ping()
            assert len(accepted) == 1
        finally:
            await client.aclose()
            for writer in accepted:
                writer.close()
            server.close()
            await server.wait_closed()

    async def test_when_redis_goes_away_take_says_so_and_sharing_resumes(
        self,
        redis_server: RedisServer,  # noqa: F811
    ) -> None:
        """Unreachable Redis raises StoreUnavailable; once it is back, holds are shared again."""
        shared = RedisHolds(redis_server.url, lease_seconds=0.6)
        shared.start()
        try:
            assert await shared.take(hold(1))
            await redis_server.stop()
            with pytest.raises(StoreUnavailable):
                await shared.take(hold(2))
            assert not shared.shared
            shared.give_back(hold(2))  # never taken remotely: a no-op, no leak
            await redis_server.start()
            deadline = time.monotonic() + 5
            while not shared.shared:
                assert time.monotonic() < deadline, "sharing did not resume"
                await shared.released(within=0.1)
            assert await shared.take(hold(3))
            shared.give_back(hold(3))
            shared.give_back(hold(1))  # held through the outage: nothing is left after it
            await _settled(shared)
        finally:
            await shared.close()
