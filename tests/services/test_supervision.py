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
    live = Liveness(SupervisionPolicy(ping_interval_s=5, missed_pings=3), clock)
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
