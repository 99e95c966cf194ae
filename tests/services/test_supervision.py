"""The supervisor's decisions on an injected clock (services/serving/supervision.py): when a
dead worker is started again and when restarts have come too often, when a worker counts as
frozen. The processes themselves are in test_tool_workers.py."""

from __future__ import annotations

import pytest

from services.base.errors import ConfigError
from services.serving.supervision import Liveness, RestartBudget, SupervisionPolicy
from tests.helpers import FakeClock


def test_restarts_back_off_and_run_out_within_a_minute() -> None:
    clock = FakeClock()
    budget = RestartBudget(SupervisionPolicy(max_restarts=3), clock)
    waits = []
    for _ in range(3):
        assert budget.allows_another()
        waits.append(budget.backoff_s())
        budget.record()
        clock.now += 1
    assert waits == [0.5, 1.0, 2.0]
    assert not budget.allows_another()  # a fourth within the minute: the server fails
    clock.now += 57.5  # the first restart is now more than a minute old
    assert budget.recent() == 2 and budget.allows_another()


def test_the_backoff_is_capped() -> None:
    clock = FakeClock()
    budget = RestartBudget(SupervisionPolicy(max_restarts=100, max_backoff_s=10.0), clock)
    for _ in range(10):
        budget.record()
    assert budget.backoff_s() == 10.0


def test_no_restart_at_all_when_the_bound_is_zero() -> None:
    assert not RestartBudget(SupervisionPolicy(max_restarts=0), FakeClock()).allows_another()


def test_a_worker_that_is_up_and_misses_pings_in_a_row_is_frozen() -> None:
    clock = FakeClock()
    policy = SupervisionPolicy(ping_interval_s=5, ping_timeout_s=10, missed_pings=3)
    live = Liveness(policy, clock)
    assert not live.due()
    clock.now += 5
    assert live.due()
    live.pinged(answered=True)
    assert not live.due()
    for _ in range(2):
        live.pinged(answered=False)
    assert live.frozen() is None
    live.pinged(answered=True)  # an answer starts the count again
    for _ in range(2):
        live.pinged(answered=False)
    assert live.frozen() is None
    live.pinged(answered=False)
    assert live.frozen() == "did not answer /health 3 times in a row (10 s each)"


def found_after(policy: SupervisionPolicy) -> float:
    """Seconds from a worker's last answer until it counts as frozen, on a fake clock that runs
    the supervisor's schedule (services/serving/workers.py `_ping_due`, `_expire_pings`): a
    ping when one is due, and every ping after the last answer unanswered until its deadline."""
    clock = FakeClock()
    live = Liveness(policy, clock)
    live.serving()
    clock.now = live.next_ping
    live.ping_sent()
    live.pinged(answered=True)  # the last answer; the loop stops right after it
    last_answer = clock.now
    while live.frozen() is None:
        assert clock.now - last_answer < 3600, "never found"
        clock.now = max(clock.now, live.next_ping)
        clock.now = live.ping_sent()  # no reply: the ping expires at its deadline
        live.pinged(answered=False)
    return clock.now - last_answer


def test_a_frozen_worker_is_found_within_10_s_of_its_last_answer_by_default() -> None:
    """Issue 27: 3 missed pings of 10 s (5 s apart) found a SIGSTOPped worker after ~42 s,
    past its sessions' client timeouts; the defaults now find it in 2 x (1 s + 3 s)."""
    policy = SupervisionPolicy()
    assert found_after(policy) <= 10.0
    assert found_after(policy) == policy.found_within_s == 8.0
    assert policy.missed_pings >= 2  # one late answer alone never kills a busy worker
    slow = SupervisionPolicy(ping_interval_s=5, ping_timeout_s=10, missed_pings=3)
    assert found_after(slow) == slow.found_within_s == 45.0


def test_a_loading_worker_is_not_frozen_until_its_start_timeout() -> None:
    clock = FakeClock()
    live = Liveness(SupervisionPolicy(missed_pings=2, start_timeout_s=300), clock)
    for _ in range(10):
        live.pinged(answered=False)  # still building its app: the pings wait in the queue
    assert live.frozen() is None
    clock.now += 300
    assert live.frozen() == "never said it serves nor answered /health in 300 s since it started"


def test_a_worker_that_said_it_serves_counts_its_misses_from_then_on() -> None:
    """A worker that freezes right after it starts serving, before any ping reached it, is
    found by its misses, not after the start timeout."""
    clock = FakeClock()
    live = Liveness(SupervisionPolicy(missed_pings=2), clock)
    live.pinged(answered=False)  # before it said so: not counted
    live.serving()
    live.pinged(answered=False)
    assert live.frozen() is None
    live.pinged(answered=False)
    assert live.frozen() is not None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("max_restarts", -1, r"^max_restarts: expected a whole"),
        (
            "missed_pings",
            0,
            r"^missed_pings: expected a whole number >= 1",
        ),
        ("ping_timeout_s", 0.0, r"^ping_timeout_s: expected a positive"),
        ("ping_interval_s", float("nan"), r"^ping_interval_s: expected a positive"),
        ("window_s", True, r"^window_s: expected a positive"),
    ],
)
def test_a_bad_policy_names_the_option(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SupervisionPolicy(**{field: value})  # type: ignore[arg-type]
