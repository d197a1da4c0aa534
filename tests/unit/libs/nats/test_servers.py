"""Replicas for a cluster of a given size and what a quorum is (fracpilot_libs.nats.servers)."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from fracpilot_libs.nats.servers import has_quorum, replicas_for, servers_in

CLUSTER = {"cluster": "fracpilot"}


def test_a_cluster_of_two_gets_one_replica_of_three_or_more_three() -> None:
    assert [replicas_for(None, CLUSTER, n) for n in (1, 2, 3, 4, 5, 7)] == [1, 1, 3, 3, 3, 3]


def test_the_setting_wins_and_a_single_server_gets_one() -> None:
    assert replicas_for(5, CLUSTER, 2) == 5
    assert replicas_for(None, {"server_id": "x"}, 3) == 1


def test_without_a_count_the_advertised_urls_tell_the_size_else_three_is_assumed() -> None:
    two = {**CLUSTER, "connect_urls": ["10.0.0.1:4222", "10.0.0.2:4222", "10.0.0.2:4222"]}
    assert replicas_for(None, two) == 1
    assert replicas_for(None, {**CLUSTER, "connect_urls": []}) == 3  # no_advertise
    assert replicas_for(None, CLUSTER) == 3


@given(st.integers(min_value=1, max_value=64))
def test_detected_replicas_are_odd_and_fit_the_cluster(servers: int) -> None:
    replicas = replicas_for(None, CLUSTER, servers)
    assert replicas % 2 == 1
    assert replicas <= min(3, servers)


@given(st.integers(min_value=1, max_value=9), st.integers(min_value=0, max_value=9))
def test_a_quorum_is_a_strict_majority(size: int, answering: int) -> None:
    assert has_quorum(answering, size) == (2 * answering > size)


def test_replies_are_counted_by_server_and_junk_is_ignored() -> None:
    def reply(server_id: str) -> bytes:
        return json.dumps({"server": {"id": server_id, "name": "n"}, "data": {}}).encode()

    assert servers_in([reply("A"), reply("B"), reply("A"), b"junk", b"[]"]) == 2
    assert servers_in([]) == 0
