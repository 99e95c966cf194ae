"""The admission decision as a table: whom a server with a 4,096 cap (512 reserved, a floor of
8, at most 2,048 per address) lets in, as the number of client addresses grows. Issue 27: two
addresses re-opening 2,100 idle sockets each filled the whole cap under a fixed half-the-cap
share, and a third address's searches failed 98 %. Then the guard itself: a newcomer within its
share takes a silent connection of an address over its own."""

from __future__ import annotations

import functools

import pytest

from services.base.errors import ConfigError
from services.serving.connections import ConnectionGuard, ConnectionLimits, Reason, refusal

LIMITS = ConnectionLimits()  # 4096, reserve 512, floor 8, at most 2048 per address


@pytest.mark.parametrize(
    ("addresses", "share"),
    [
        (1, 2048),  # alone: the bound, half the cap
        (2, 1792),  # (4096 - 512) / 2
        (3, 1194),
        (8, 448),
        (9, 398),
        (448, 8),  # the even split reaches the floor
        (10_000, 8),  # never below it
    ],
)
def test_the_share_is_an_even_split_of_the_unreserved_connections(
    addresses: int, share: int
) -> None:
    assert LIMITS.share(addresses) == share


@pytest.mark.parametrize(
    ("held", "open_total", "addresses", "reason"),
    [
        (0, 0, 1, None),
        (2047, 2047, 1, None),
        (2048, 2048, 1, "client_share"),  # alone, at the bound
        # two flooders, the case: each stops at 1,792, leaving the reserve
        (1791, 3583, 2, None),
        (1792, 3584, 2, "client_share"),
        # a third address arrives: it gets in although the flooders hold all but the reserve
        (0, 3584, 3, None),
        (7, 3591, 3, None),
        (8, 3592, 3, "reserved"),  # the reserve is for newcomers, not a third flooder
        # the flooders' share shrank to 1,194: holding more, they get nothing until they drop
        (1792, 3592, 3, "client_share"),
        (1193, 3000, 3, None),
        # eight flooders at 448 each and a newcomer
        (448, 3584, 8, "client_share"),
        (0, 3584, 9, None),
        # the cap itself always holds
        (0, 4096, 9, "server_full"),
        (0, 4096, 1, "server_full"),
    ],
)
def test_who_is_let_in(held: int, open_total: int, addresses: int, reason: Reason | None) -> None:
    assert refusal(held, open_total, addresses, LIMITS) == reason


def test_a_given_bound_and_reserve_are_used() -> None:
    limits = ConnectionLimits(
        max_connections=256, max_connections_per_client=50, reserved_connections=0
    )
    assert limits.share(1) == 50
    assert limits.share(8) == 32
    assert refusal(31, 255, 8, limits) is None  # no reserve: up to the cap
    assert refusal(0, 256, 9, limits) == "server_full"


def test_the_defaults_follow_the_cap() -> None:
    limits = ConnectionLimits(max_connections=256)
    assert (limits.reserve, limits.client_share, limits.share(2), limits.share(8)) == (
        32,
        128,
        112,
        28,
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_connections_per_client": 0},
        {"reserved_connections": -1},
        {"reserved_connections": 4096},
        {"reserved_connections": True},
    ],
)
def test_bad_limits_are_refused_by_name(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match=next(iter(kwargs))):
        ConnectionLimits(**kwargs)  # type: ignore[arg-type]


def nothing_scheduled(delay: float, callback: object) -> None:
    """The guard's batched reports are not under test here: nothing runs later."""


def test_a_newcomer_takes_a_silent_connection_of_an_address_over_its_share() -> None:
    """Many addresses arriving at once exhaust any reserve; without eviction the newcomer was
    refused until the header timeout trimmed the others (1.5 s of refusals at a 2 s timeout)."""
    limits = ConnectionLimits(
        max_connections=8,
        reserved_connections=2,
        min_connections_per_client=1,
        max_connections_per_client=6,
    )
    guard = ConnectionGuard(limits)
    closed: list[str] = []
    for number in range(6):
        assert guard.admit("a", nothing_scheduled)
        guard.hold_silent("a", f"a{number}", functools.partial(closed.append, f"a{number}"))
    guard.spoke("a", "a0")  # a0 sent a request: it is not evictable
    assert guard.admit("b", nothing_scheduled)  # from the reserve
    assert not guard.admit("b", nothing_scheduled)  # b has the floor: the reserve is not b's
    assert guard.admit("c", nothing_scheduled)  # the server is full now
    assert guard.admit("d", nothing_scheduled)  # a's oldest silent connection gave way
    assert closed == ["a1"]
    assert (guard.evicted, guard.open_total, guard.open_by_client["a"]) == (1, 8, 5)


def test_only_silent_connections_of_an_address_over_its_share_give_way() -> None:
    limits = ConnectionLimits(
        max_connections=4,
        reserved_connections=0,
        min_connections_per_client=1,
        max_connections_per_client=4,
    )
    guard = ConnectionGuard(limits)
    for number in range(3):
        assert guard.admit("a", nothing_scheduled)
        guard.hold_silent("a", number, lambda: None)
        guard.spoke("a", number)  # each carries a request
    assert guard.admit("b", nothing_scheduled)
    assert not guard.admit("c", nothing_scheduled)  # a holds 3 over its share of 1, all busy
    assert guard.refused == {"server_full": 1}
    assert guard.evicted == 0
