"""The orderings: Fifo, and Fair, the Virtual Token Counter (Sheng et al., OSDI 2024).

The properties are checked on a small discrete-event simulation that calls an ordering the
way admission does: slots, users with weights, requests that hold a slot for one step per
output token.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.admission.scheduler import Candidate, Fair, Fifo, Ordering

W_IN, W_OUT = 1.0, 2.0  # Fair's defaults; the simulation measures service with the same costs

# When the simulation calls on_arrival: "on_waiting" whenever a user had nothing waiting,
# against the users waiting (the contract); "on_active" only when it had nothing waiting or
# running, against the users waiting or running; "never".
Lift = Literal["on_waiting", "on_active", "never"]


@dataclass(frozen=True)
class Job:
    """One request of a simulated workload."""

    user: str
    arrival: int  # the step it starts waiting
    input_tokens: int
    output_tokens: int  # at least 1: the request holds its slot one step per output token


@dataclass
class Run:
    """What a simulation saw."""

    # Per dispatched job: steps from becoming its user's first waiting request to dispatch.
    waits: list[tuple[Job, int]] = field(default_factory=list)
    # (step, user, weighted tokens): w_in * prompt at dispatch, w_out per streamed token.
    service: list[tuple[int, str, float]] = field(default_factory=list)

    def served(self, user: str, start: int = 0, stop: float = math.inf) -> float:
        return sum(
            amount for step, who, amount in self.service if who == user and start <= step < stop
        )


@dataclass
class _Slot:
    job: Job
    left: int  # output tokens still to stream


class Simulation:
    """Slots fed by an ordering; each step, arrivals wait, free slots are filled, tokens stream."""

    def __init__(
        self,
        ordering: Ordering,
        slots: int,
        weights: dict[str, float],
        jobs: Sequence[Job],
        lift: Lift = "on_waiting",
    ) -> None:
        self.ordering, self.slots, self.weights, self.lift = ordering, slots, weights, lift
        self.pending = deque(sorted(jobs, key=lambda job: job.arrival))  # stable: list order
        self.waiting: dict[str, deque[tuple[Candidate, Job]]] = {}
        self.head_since: dict[str, int] = {}
        self.busy: list[_Slot] = []
        self.running: Counter[str] = Counter()
        self.seq = itertools.count()
        self.result = Run()

    def run(self, until: float = math.inf) -> Run:
        step = 0
        while (self.pending or self.waiting or self.busy) and step < until:
            self._arrive(step)
            self._dispatch(step)
            self._stream(step)
            step += 1
        return self.result

    def _active(self, user: str) -> bool:
        return user in self.waiting or self.running[user] > 0

    def _arrive(self, step: int) -> None:
        while self.pending and self.pending[0].arrival <= step:
            job = self.pending.popleft()
            self._lift(job.user)
            queue = self.waiting.setdefault(job.user, deque())
            if not queue:
                self.head_since[job.user] = step
            weight = self.weights[job.user]
            queue.append((Candidate(next(self.seq), job.user, weight, job.input_tokens), job))

    def _lift(self, user: str) -> None:
        if self.lift == "on_waiting" and user not in self.waiting:
            self.ordering.on_arrival(user, frozenset(self.waiting))
        elif self.lift == "on_active" and not self._active(user):
            others = {other for other in self.weights if other != user and self._active(other)}
            self.ordering.on_arrival(user, others)

    def _dispatch(self, step: int) -> None:
        while len(self.busy) < self.slots and self.waiting:
            candidates = [queue[0][0] for queue in self.waiting.values()]
            chosen = self.ordering.choose(candidates)
            # Work conservation: the slot goes to one of the waiting requests, never to none.
            assert chosen in candidates
            queue = self.waiting[chosen.user]
            _, job = queue.popleft()
            self.result.waits.append((job, step - self.head_since[job.user]))
            self.running[job.user] += 1
            if queue:
                self.head_since[job.user] = step
            else:
                del self.waiting[job.user]
            self.ordering.on_dispatch(chosen)
            self.result.service.append((step, job.user, W_IN * job.input_tokens))
            self.busy.append(_Slot(job, job.output_tokens))

    def _stream(self, step: int) -> None:
        for slot in self.busy:
            user = slot.job.user
            self.ordering.on_output(user, self.weights[user], 1)
            self.result.service.append((step, user, W_OUT))
            slot.left -= 1
            if slot.left == 0:
                self.running[user] -= 1
                if not self._active(user):
                    self.ordering.on_idle(user)
        self.busy = [slot for slot in self.busy if slot.left > 0]


def backlog(user: str, sizes: Sequence[tuple[int, int]], arrival: int, tokens: int) -> list[Job]:
    """Jobs of the given (input, output) sizes, repeated until they stream ``tokens``."""
    jobs: list[Job] = []
    for prompt, output in itertools.cycle(sizes):
        if tokens <= 0:
            break
        jobs.append(Job(user, arrival, prompt, output))
        tokens -= output
    return jobs


def request_cost(jobs: Sequence[Job], weight: float) -> float:
    """The largest counter increase one request can cause, for a user of ``weight``."""
    most_in = max(job.input_tokens for job in jobs)
    most_out = max(job.output_tokens for job in jobs)
    return (W_IN * most_in + W_OUT * most_out) / weight


# The wait bound, under the contract (on_arrival whenever a user's queue was empty, against
# the users waiting). R is request_cost for the smallest weight, S the number of slots. Fair
# dispatches the candidate with the smallest finish: its user's counter plus its prompt's
# charge, at most R above the counter.
# 1. While anyone waits, the smallest counter m among waiting users never decreases: counters
#    only grow, and a lift sets at most m. A user is dispatched at a finish no greater than
#    that of the user at m, so its counter is then at most m + R; with at most S requests
#    running, no user's counter plus what its running requests will still be charged
#    exceeds m by more than (S + 1) * R.
# 2. While u's first request waits, every slot is busy (u is always a candidate), u's
#    counter stays <= m0 + (S + 1) * R (m0: m when the wait began) and its finish
#    <= m0 + (S + 2) * R. Another user v is dispatched only at a finish <= u's, starting
#    from a counter >= m0 (it was waiting), so the requests v starts meanwhile are charged
#    at most (2 * S + 2) * R in all, w_out/w_v for each step they hold a slot.
# 3. Those take at most sum_v (2*S + 2)*R*w_v/w_out slot-steps, the requests already running
#    at most S*O (O: the largest output); over S slots, u waits at most
#    O + (2 + 2/S)*R*sum_v(w_v)/w_out steps.
def wait_bound(weights: dict[str, float], jobs: Sequence[Job], user: str, slots: int) -> float:
    """Steps ``user``'s first waiting request can wait before a slot is chosen for it."""
    users = {job.user for job in jobs}
    costliest = request_cost(jobs, min(weights[each] for each in users))
    others = sum(weights[other] for other in users - {user})
    return max(job.output_tokens for job in jobs) + (2 + 2 / slots) * costliest * others / W_OUT


def spread(per_weight: dict[str, float]) -> float:
    """The largest relative distance of a user's service per unit of weight from the mean."""
    mean = sum(per_weight.values()) / len(per_weight)
    return max(abs(value / mean - 1) for value in per_weight.values())


WEIGHTS = st.sampled_from([0.5, 1.0, 2.0, 4.0])
SIZES = st.lists(st.tuples(st.integers(0, 32), st.integers(1, 16)), min_size=1, max_size=4)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[int, dict[str, float], list[Job]]:
    slots = draw(st.integers(1, 4))
    users = [f"u{index}" for index in range(draw(st.integers(1, 4)))]
    weights = {user: draw(WEIGHTS) for user in users}
    arrivals = st.sampled_from([0, 30]) | st.integers(0, 120)  # shared steps make bursts
    job = st.builds(Job, st.sampled_from(users), arrivals, st.integers(0, 64), st.integers(1, 24))
    return slots, weights, draw(st.lists(job, min_size=1, max_size=60))


# -- 1. no starvation --------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(workloads())
def test_every_request_is_dispatched_within_the_wait_bound(
    workload: tuple[int, dict[str, float], list[Job]],
) -> None:
    """Under Fair, a user's first waiting request gets a slot within the derived bound."""
    slots, weights, jobs = workload
    run = Simulation(Fair(W_IN, W_OUT), slots, weights, jobs).run()
    assert len(run.waits) == len(jobs)
    for job, waited in run.waits:
        assert waited <= wait_bound(weights, jobs, job.user, slots)


def steady_user_then_burst(lift: Lift) -> tuple[int, float]:
    """A user keeps one request running for long, then bursts: the longest wait of the others."""
    weights = {"a": 1.0, "b": 1.0, "steady": 1.0}
    jobs = [job for user in ("a", "b") for job in backlog(user, [(0, 1)], 0, 8 * 1300)]
    # Each of its requests arrives one step before the previous one ends: never idle.
    jobs += [Job("steady", 15 * k, 0, 16) for k in range(60)]
    jobs += [Job("steady", 15 * 59 + 5, 0, 16)] * 200
    run = Simulation(Fair(W_IN, W_OUT), 8, weights, jobs, lift).run(until=1300)
    longest = max(waited for job, waited in run.waits if job.user != "steady")
    return longest, wait_bound(weights, jobs, "a", 8)


def test_a_user_that_never_goes_idle_cannot_bank_credit_under_the_contract() -> None:
    """Lifting whenever a user's queue was empty keeps the others within the wait bound."""
    longest, bound = steady_user_then_burst("on_waiting")
    assert longest <= bound


def test_lifting_only_users_that_were_idle_lets_a_busy_user_bank_credit() -> None:
    """Calling on_arrival only for users with nothing running lets a steady user's burst starve."""
    longest, bound = steady_user_then_burst("on_active")
    assert longest > 2 * bound


# -- 2. work conservation ----------------------------------------------------------------

USERS = st.sampled_from(["ann", "bob", "cy", "dee"])
TOKENS = st.floats(-1000, 1000)


@st.composite
def candidate_lists(draw: st.DrawFn) -> list[Candidate]:
    users = draw(st.lists(USERS, min_size=1, unique=True))
    seqs = draw(
        st.lists(st.integers(0, 10**6), min_size=len(users), max_size=len(users), unique=True)
    )
    return [
        Candidate(seq, user, draw(st.floats(0.01, 100)), draw(st.floats(0, 10_000)))
        for seq, user in zip(seqs, users, strict=True)
    ]


HISTORY = st.lists(
    st.one_of(
        st.tuples(st.just("arrival"), USERS, st.frozensets(USERS)),
        st.tuples(st.just("dispatch"), candidate_lists().map(lambda rows: rows[0])),
        st.tuples(st.just("output"), USERS, WEIGHTS, TOKENS),
        st.tuples(st.just("correction"), USERS, WEIGHTS, TOKENS),
        st.tuples(st.just("idle"), USERS),
    ),
    max_size=30,
)


def replay(ordering: Ordering, history: list[tuple[object, ...]]) -> None:
    for kind, *args in history:
        match kind, args:
            case "arrival", [str(user), frozenset() as others]:
                ordering.on_arrival(user, {str(other) for other in others} - {user})
            case "dispatch", [Candidate() as candidate]:
                ordering.on_dispatch(candidate)
            case "output", [str(user), float(weight), float(tokens)]:
                ordering.on_output(user, weight, tokens)
            case "correction", [str(user), float(weight), float(tokens)]:
                ordering.on_correction(user, weight, tokens)
            case "idle", [str(user)]:
                ordering.on_idle(user)
            case _:
                raise AssertionError(f"unknown event {kind}{args}")


@settings(max_examples=200, deadline=None)
@given(HISTORY, candidate_lists())
def test_choose_returns_one_of_the_candidates_whatever_happened_before(
    history: list[tuple[object, ...]], candidates: list[Candidate]
) -> None:
    """Both orderings pick a member of any candidate list after any sequence of events."""
    for ordering in (Fair(W_IN, W_OUT), Fifo()):
        replay(ordering, history)
        assert ordering.choose(candidates) in candidates


@settings(max_examples=200, deadline=None)
@given(HISTORY, candidate_lists())
def test_fair_picks_the_smallest_finish_and_the_earlier_request_on_a_tie(
    history: list[tuple[object, ...]], candidates: list[Candidate]
) -> None:
    """Fair's choice has the smallest reported counter plus its own prompt's charge, then seq."""
    fair = Fair(W_IN, W_OUT)
    replay(fair, history)
    counters = fair.counters()

    def finish(each: Candidate) -> tuple[float, int]:
        return counters.get(each.user, 0.0) + W_IN * each.input_tokens / each.weight, each.seq

    assert fair.choose(candidates) == min(candidates, key=finish)


# -- 3. proportional service -------------------------------------------------------------

SHARES = {"one": 1.0, "two": 2.0, "four": 4.0}
LONG_RUN = 3000  # steps


@settings(max_examples=8, deadline=None)
@given(st.integers(1, 4), st.fixed_dictionaries({user: SIZES for user in SHARES}))
def test_backlogged_users_are_served_in_proportion_to_their_weights(
    slots: int, sizes: dict[str, list[tuple[int, int]]]
) -> None:
    """Users with weights 1:2:4 who always have requests waiting get service within 10% of 1:2:4."""
    jobs = [job for user in SHARES for job in backlog(user, sizes[user], 0, slots * LONG_RUN)]
    run = Simulation(Fair(W_IN, W_OUT), slots, SHARES, jobs).run(until=LONG_RUN)
    assert spread({user: run.served(user) / SHARES[user] for user in SHARES}) <= 0.10


def test_fifo_lets_one_flooding_user_take_the_others_shares() -> None:
    """With a flood queued first, Fifo serves only the flooder, where Fair keeps to 1:2:4."""
    jobs = backlog("one", [(16, 8)], 0, 2 * LONG_RUN)
    jobs += [job for user in ("two", "four") for job in backlog(user, [(16, 8)], 1, 2 * LONG_RUN)]
    shares = {}
    for name, ordering in (("fifo", Fifo()), ("fair", Fair(W_IN, W_OUT))):
        run = Simulation(ordering, 2, SHARES, jobs).run(until=LONG_RUN)
        shares[name] = spread({user: run.served(user) / SHARES[user] for user in SHARES})
    assert shares["fifo"] > 1.0
    assert shares["fair"] <= 0.10


# -- 4. lifting prevents banking ---------------------------------------------------------

IDLE, WINDOW = 1000, 300  # steps


def burst_excess(
    ordering: Ordering,
    slots: int,
    weights: dict[str, float],
    sizes: list[tuple[int, int]],
    lift: Lift,
) -> tuple[float, float]:
    """User a is always busy; b idles IDLE steps, then bursts. b's excess and its bound.

    The excess is b's service minus a's, each per unit of weight, over the WINDOW steps
    after b arrives. Lifted to a's counter, b can be ahead by at most its in-flight
    requests at the window's end, slots * request_cost, and, ordered by finish, by a's
    next prompt: b goes first while its counter plus its own prompt is below a's plus a's.
    """
    jobs = backlog("a", sizes, 0, slots * (IDLE + WINDOW)) + backlog(
        "b", sizes, IDLE, slots * WINDOW
    )
    run = Simulation(ordering, slots, weights, jobs, lift).run(until=IDLE + WINDOW)
    ahead = {user: run.served(user, IDLE) / weights[user] for user in weights}
    a_prompt = W_IN * max(prompt for prompt, _ in sizes) / weights["a"]
    return ahead["b"] - ahead["a"], slots * request_cost(jobs, weights["b"]) + a_prompt


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 4), WEIGHTS, WEIGHTS, SIZES)
def test_a_user_back_from_idle_gets_no_more_than_its_share(
    slots: int, weight_a: float, weight_b: float, sizes: list[tuple[int, int]]
) -> None:
    """After a long idle spell, a burst is served at its weight's share, not on banked credit."""
    weights = {"a": weight_a, "b": weight_b}
    excess, bound = burst_excess(Fair(W_IN, W_OUT), slots, weights, sizes, "on_waiting")
    assert excess <= bound


def test_without_lifting_a_user_back_from_idle_takes_more_than_its_share() -> None:
    """Never calling on_arrival lets the idle user's burst take the window: the check can fail."""
    weights = {"a": 1.0, "b": 1.0}
    excess, bound = burst_excess(Fair(W_IN, W_OUT), 2, weights, [(8, 8)], "never")
    assert excess > 10 * bound


def test_a_light_user_first_back_after_a_quiet_spell_gets_no_credit_from_its_past() -> None:
    """When nobody waits, an arrival joins at the last dispatched user's counter, not below."""
    weights = {"heavy": 1.0, "light": 1.0}
    jobs = backlog("heavy", [(8, 8)], 0, 2 * IDLE)  # alone: done in about IDLE steps
    back = IDLE + 200
    jobs += backlog("light", [(8, 8)], back, 2 * WINDOW) + backlog(
        "heavy", [(8, 8)], back + 1, 2 * WINDOW
    )
    run = Simulation(Fair(W_IN, W_OUT), 2, weights, jobs).run(until=back + 1 + WINDOW)
    ahead = {user: run.served(user, back + 1) / weights[user] for user in weights}
    assert ahead["light"] - ahead["heavy"] <= 2 * request_cost(jobs, 1.0)


# -- 5. a short question goes ahead of a long prompt at an equal start -------------------


class CounterOnly(Fair):
    """VTC compared at the start: the smallest counter, whatever the request will cost."""

    def choose(self, candidates: Sequence[Candidate]) -> Candidate:
        counters = self.counters()
        return min(candidates, key=lambda each: (counters.get(each.user, 0.0), each.seq))


def question_waits(
    ordering: Ordering,
    slots: int,
    heavy: list[tuple[int, int]],
    question: tuple[int, int],
    spacing: int,
) -> tuple[int, int]:
    """Two users keep long prompts waiting; a third asks a question every ``spacing`` steps.

    The longest wait of the questions, and the longest heavy output: the most steps before
    some slot frees.
    """
    weights = {"h1": 1.0, "h2": 1.0, "asker": 1.0}
    questions = [Job("asker", 20 + k * spacing, *question) for k in range(20)]
    end = questions[-1].arrival + spacing
    jobs = [job for user in ("h1", "h2") for job in backlog(user, heavy, 0, slots * end)]
    run = Simulation(ordering, slots, weights, jobs + questions).run(until=end)
    waits = [waited for job, waited in run.waits if job.user == "asker"]
    assert len(waits) == len(questions)
    return max(waits), max(output for _, output in heavy)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3),
    st.lists(st.tuples(st.integers(100, 400), st.integers(1, 16)), min_size=1, max_size=3),
    st.tuples(st.integers(0, 24), st.integers(1, 8)),
    st.integers(30, 60),
)
def test_a_returning_users_question_takes_the_next_free_slot_ahead_of_long_prompts(
    slots: int, heavy: list[tuple[int, int]], question: tuple[int, int], spacing: int
) -> None:
    """Lifted level with backlogged long prompts, a cheaper question finishes first, so it waits
    only for a slot to free."""
    # The asker's counter is at most the lift level plus one question's charge (40), its
    # finish at most 64 above it; a long prompt's finish is at least 100 above it.
    longest, slot_frees = question_waits(Fair(W_IN, W_OUT), slots, heavy, question, spacing)
    assert longest <= slot_frees


def test_compared_at_the_start_a_question_waits_behind_long_prompts() -> None:
    """Ordered by counter alone, a lifted question ties with a long prompt and loses on arrival."""
    longest, slot_frees = question_waits(CounterOnly(W_IN, W_OUT), 1, [(200, 16)], (8, 4), 40)
    assert longest > slot_frees


def test_a_long_prompt_goes_once_the_questions_have_caught_up_with_its_finish() -> None:
    """A question goes first at an equal counter; once its user's counter passes the long
    prompt's finish, the long prompt goes."""
    fair = Fair(W_IN, W_OUT)
    fair.on_output("heavy", 1.0, 100)  # 200
    fair.on_arrival("light", ["heavy"])  # lifted to 200
    long_prompt, question = Candidate(1, "heavy", 1.0, 1200), Candidate(2, "light", 1.0, 40)
    assert fair.choose([long_prompt, question]) is question
    fair.on_output("light", 1.0, 600)  # 1400: the question would finish at 1440
    assert fair.choose([long_prompt, question]) is long_prompt


# -- 6. corrections ----------------------------------------------------------------------


def test_charges_follow_the_costs_and_the_weight() -> None:
    """Dispatch, output and correction move the counter by w * tokens / weight, exactly."""
    fair = Fair(w_in=3.0, w_out=5.0)
    fair.on_dispatch(Candidate(0, "ann", 2.0, 100))
    assert fair.counters() == {"ann": 150.0}
    fair.on_correction("ann", 2.0, -40)
    assert fair.counters() == {"ann": 90.0}
    fair.on_output("ann", 2.0, 8)
    assert fair.counters() == {"ann": 110.0}
    fair.on_output("ann", 2.0, -8)
    assert fair.counters() == {"ann": 90.0}


def test_an_estimate_corrected_to_the_real_count_charges_the_real_count() -> None:
    """A dispatch at an estimate plus its correction equals a dispatch at the actual count."""
    estimated, actual = Fair(), Fair()
    estimated.on_dispatch(Candidate(0, "ann", 4.0, 120))
    estimated.on_correction("ann", 4.0, 37 - 120)
    actual.on_dispatch(Candidate(0, "ann", 4.0, 37))
    assert estimated.counters() == actual.counters()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["dispatch", "output", "correction"]), WEIGHTS, st.integers(-500, 500)
        )
    )
)
def test_counters_are_the_exact_sum_of_the_charges(
    charges: list[tuple[str, float, int]],
) -> None:
    """Any mix of charges and negative corrections leaves the counter at their exact sum."""
    fair, expected = Fair(W_IN, W_OUT), 0.0
    for kind, weight, tokens in charges:
        if kind == "dispatch":
            fair.on_dispatch(Candidate(0, "ann", weight, abs(tokens)))
            expected += W_IN * abs(tokens) / weight
        elif kind == "output":
            fair.on_output("ann", weight, tokens)
            expected += W_OUT * tokens / weight
        else:
            fair.on_correction("ann", weight, tokens)
            expected += W_IN * tokens / weight
    assert fair.counters().get("ann", 0.0) == expected


# -- the parts, one by one ---------------------------------------------------------------


def test_fair_lifts_an_arrival_to_the_least_served_waiting_user() -> None:
    """on_arrival raises a counter to the smallest of the others' counters, never lowers it."""
    fair = Fair()
    fair.on_output("ann", 1.0, 50)  # 100
    fair.on_output("bob", 1.0, 20)  # 40
    fair.on_arrival("cy", ["ann", "bob"])
    fair.on_arrival("ann", ["bob", "cy"])
    assert fair.counters() == {"ann": 100.0, "bob": 40.0, "cy": 40.0}


def test_fair_counts_users_it_has_not_seen_as_zero() -> None:
    """Unknown users in active_users or among candidates have a counter of 0."""
    fair = Fair()
    fair.on_output("ann", 1.0, 5)
    fair.on_arrival("ann", ["new"])
    assert fair.counters() == {"ann": 10.0}
    chosen = fair.choose([Candidate(1, "ann", 1.0, 0), Candidate(2, "stranger", 1.0, 0)])
    assert chosen.user == "stranger"


def test_fair_lifts_an_arrival_to_the_last_dispatched_user_when_nobody_waits() -> None:
    """With no other user waiting, the arrival joins at the last dispatched user's counter."""
    fair = Fair()
    fair.on_arrival("ann", [])
    assert fair.counters() == {"ann": 0.0}
    fair.on_dispatch(Candidate(0, "ann", 1.0, 30))
    fair.on_idle("ann")
    fair.on_arrival("bob", [])
    assert fair.counters() == {"ann": 30.0, "bob": 30.0}


def test_fair_keeps_counters_of_idle_users() -> None:
    """on_idle drops nothing, so a returning user is compared with what it used."""
    fair = Fair()
    fair.on_output("ann", 1.0, 5)
    fair.on_idle("ann")
    assert fair.counters() == {"ann": 10.0}


def test_fair_counters_are_a_snapshot() -> None:
    """Changing the returned mapping does not change the ordering."""
    fair = Fair()
    fair.on_output("ann", 1.0, 5)
    snapshot = fair.counters()
    assert isinstance(snapshot, dict)
    snapshot["ann"] = -1.0
    assert fair.counters() == {"ann": 10.0}


def test_fair_refuses_negative_token_costs() -> None:
    """A negative cost would turn service into credit."""
    with pytest.raises(ValueError, match="costs"):
        Fair(w_in=-1.0)


def test_fifo_picks_the_earliest_arrival_whatever_was_charged() -> None:
    """Fifo ignores every event and reports no counters."""
    fifo = Fifo()
    fifo.on_output("ann", 1.0, -1000)
    fifo.on_arrival("bob", ["ann"])
    candidates = [Candidate(7, "ann", 1.0, 0), Candidate(3, "bob", 4.0, 0)]
    assert fifo.choose(candidates).seq == 3
    assert fifo.counters() == {}


@pytest.mark.parametrize("weight", [0.0, -1.0, math.nan])
def test_a_candidate_needs_a_positive_weight(weight: float) -> None:
    """Zero, negative and NaN weights are refused when the candidate is made."""
    with pytest.raises(ValueError, match="weight"):
        Candidate(0, "ann", weight, 0)
