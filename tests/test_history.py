"""The house page's memory: the last hour by minute, and recent refusals."""

from __future__ import annotations

from datetime import datetime

from gateway.core.vocabulary import Reason, RequestClass
from gateway.edge.record import RequestRecord
from gateway.observe.history import MINUTES, RECENT_REFUSALS, RECENT_STRANGERS, History

NOON = datetime(2025, 3, 14, 12, 0, 30).timestamp()


class Clock:
    """Wall-clock seconds, moved by hand."""

    def __init__(self, now: float = NOON) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def served(user: str = "bob", ttft: float | None = 0.2, tokens: int = 10) -> RequestRecord:
    record = RequestRecord("r", "POST", "/api/chat", arrived=100.0, user=user, model="m")
    record.request_class = RequestClass.LIGHT
    record.status = 200
    record.first_byte_at = None if ttft is None else 100.0 + ttft
    record.prompt_tokens, record.completion_tokens = tokens, 2 * tokens
    return record


def refused(user: str | None = "bob", reason: Reason = Reason.USER_QUEUE_FULL) -> RequestRecord:
    record = RequestRecord("r", "POST", "/api/chat", user=user, model="m")
    record.status, record.reason = 503, reason
    return record


class TestLastHour:
    def test_ttft_quantiles_of_a_minute_are_within_a_bucket_of_the_true_ones(self) -> None:
        """p50 and p95 of a minute's first tokens are at most a quarter above the true ones."""
        history = History(Clock())
        for n in range(1, 101):
            history.observe(served(ttft=n / 100))  # 10 ms .. 1 s
        minute = history.snapshot().minutes[-1]
        assert minute.requests == 100
        assert minute.ttft_p50 is not None and minute.ttft_p95 is not None
        assert 0.50 <= minute.ttft_p50 <= 0.50 * 1.25
        assert 0.95 <= minute.ttft_p95 <= 0.95 * 1.25

    def test_the_hour_has_sixty_minutes_and_forgets_older_ones(self) -> None:
        """Every minute of the hour is listed, empty ones too; a minute 61 ago is gone."""
        clock = Clock()
        history = History(clock)
        history.observe(refused())
        clock.now += 59 * 60
        minutes = history.snapshot().minutes
        assert len(minutes) == MINUTES
        assert minutes[0].refusals == 1 and sum(m.refusals for m in minutes) == 1
        assert minutes[1].ttft_p50 is None
        clock.now += 60
        assert sum(m.refusals for m in history.snapshot().minutes) == 0

    def test_memory_stays_bounded_however_many_requests_pass(self) -> None:
        """Ten thousand requests over two hours leave 60 minutes and 20 refusals in memory."""
        clock = Clock()
        history = History(clock)
        for n in range(10_000):
            clock.now += 0.72  # two hours in all
            history.observe(refused() if n % 3 else served())
        snapshot = history.snapshot()
        assert len(history._minutes) == MINUTES
        assert len(snapshot.refusals) == RECENT_REFUSALS

    def test_listings_and_the_pages_own_polls_are_not_counted(self) -> None:
        """A request that was never classified (a listing, /status, /ui) is not the house's."""
        history = History(Clock())
        history.observe(RequestRecord("r", "GET", "/status", user="bob"))
        snapshot = history.snapshot()
        assert sum(m.requests for m in snapshot.minutes) == 0


class TestRefusals:
    def test_recent_refusals_come_newest_first_with_their_reason(self) -> None:
        """The ring holds the last refusals, newest first, each with who and why."""
        clock = Clock()
        history = History(clock)
        history.observe(refused("bob", Reason.USER_QUEUE_FULL))
        clock.now += 1
        history.observe(refused(None, Reason.UNAUTHORIZED))
        history.observe(refused("carol", Reason.WAIT_TIMEOUT))
        snapshot = history.snapshot()
        first, second = snapshot.refusals
        assert (first.user, first.reason, first.at) == ("carol", Reason.WAIT_TIMEOUT, NOON + 1)
        assert (second.user, second.reason) == ("bob", Reason.USER_QUEUE_FULL)
        [stranger] = snapshot.strangers  # kept apart from the household's
        assert (stranger.user, stranger.reason, stranger.at) == (
            None,
            Reason.UNAUTHORIZED,
            NOON + 1,
        )

    def test_a_strangers_stream_of_401s_leaves_the_households_refusals_listed(self) -> None:
        """Callers the gateway did not recognise keep a few places of their own: fifty
        wrong keys in a row still leave bob's refusal on the page."""
        clock = Clock()
        history = History(clock)
        history.observe(refused("bob", Reason.USER_QUEUE_FULL))
        for _ in range(50):
            clock.now += 0.1
            history.observe(refused(None, Reason.UNAUTHORIZED))
        snapshot = history.snapshot()
        assert [r.user for r in snapshot.refusals] == ["bob"]
        assert [r.user for r in snapshot.strangers] == [None] * RECENT_STRANGERS

    def test_refusals_off_the_apis_are_not_the_households(self) -> None:
        """A scanner's 404 and a page's 401 before its key is typed are neither listed nor
        counted: the refusal rate is the household's."""
        history = History(Clock())
        for path in ("/wp-login.php", "/status", "/ui/me.json"):
            record = RequestRecord("r", "GET", path)
            record.status, record.reason = 401, Reason.UNAUTHORIZED
            history.observe(record)
        snapshot = history.snapshot()
        assert snapshot.refusals == () and sum(m.refusals for m in snapshot.minutes) == 0

    def test_a_refused_path_is_kept_short(self) -> None:
        """A path of 8 KiB is kept as its first 200 characters."""
        history = History(Clock())
        record = RequestRecord("r", "GET", "/v1/models/" + "x" * 8000, user="bob")
        record.status, record.reason = 404, Reason.MODEL_NOT_FOUND
        history.observe(record)
        [refusal] = history.snapshot().refusals
        assert len(refusal.path) == 200
