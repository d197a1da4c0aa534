"""The last-seen tracker behind stale-series removal (time is an argument)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fracpilot_libs.series_expiry import LastSeen


def test_a_key_expires_once_unseen_for_longer_than_the_ttl() -> None:
    seen: LastSeen[str] = LastSeen(ttl_s=10.0)
    seen.touch("a", 100.0)
    seen.touch("b", 105.0)
    assert seen.expire(110.0) == []  # exactly the TTL: still fresh
    assert seen.expire(110.5) == ["a"]
    assert "a" not in seen
    assert "b" in seen
    assert seen.expire(110.5) == []  # reported once
    assert seen.expire(116.0) == ["b"]
    assert len(seen) == 0


def test_touching_again_keeps_a_key_and_an_older_time_does_not_age_it() -> None:
    seen: LastSeen[tuple[str, str]] = LastSeen(ttl_s=10.0)
    seen.touch(("ns", "w"), 100.0)
    seen.touch(("ns", "w"), 108.0)
    seen.touch(("ns", "w"), 90.0)  # a late report of an earlier sighting
    assert seen.last_seen(("ns", "w")) == 108.0
    assert seen.expire(117.0) == []


def test_forget_drops_a_key_and_says_whether_it_was_there() -> None:
    seen: LastSeen[str] = LastSeen(ttl_s=1.0)
    seen.touch("a", 0.0)
    assert seen.forget("a")
    assert not seen.forget("a")
    assert seen.expire(100.0) == []


def test_a_ttl_must_be_positive() -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        LastSeen(ttl_s=0)


@given(
    sightings=st.lists(st.tuples(st.sampled_from("abcde"), st.floats(0, 1000)), max_size=30),
    now=st.floats(0, 2000),
    ttl=st.floats(0.1, 500),
)
def test_expire_returns_exactly_the_keys_whose_last_sighting_is_too_old(
    sightings: list[tuple[str, float]], now: float, ttl: float
) -> None:
    seen: LastSeen[str] = LastSeen(ttl_s=ttl)
    last: dict[str, float] = {}
    for key, at in sightings:
        seen.touch(key, at)
        last[key] = max(at, last.get(key, at))
    keys = seen.keys()  # a live view: what expire leaves
    gone = seen.expire(now)
    assert set(gone) == {k for k, at in last.items() if at < now - ttl}
    assert {k for k in last if k in seen} == set(last) - set(gone) == set(keys)
