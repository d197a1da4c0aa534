"""The informer's pure parts: keys, trimming, the relist diff, pages, watch events, misses."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fracpilot_libs.kube.store import (
    Delta,
    NegativeCache,
    WatchEvent,
    WatchExpiredError,
    WatchFailedError,
    apply_event,
    diff,
    metadata_only,
    object_key,
    parse_event,
    parse_page,
    resource_version,
    trimmed,
)


def pod(name: str, rv: int, namespace: str = "ns", **meta: Any) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": str(rv), **meta},
        "spec": {"nodeName": "n1"},
    }


def test_keys_and_versions() -> None:
    assert object_key(pod("a", 1)) == ("ns", "a")
    assert object_key({"metadata": {"name": "node-1"}}) == ("", "node-1")
    assert resource_version("42") == 42
    assert resource_version(None) == resource_version("x") == 0


def test_trimmed_drops_managed_fields_without_touching_the_original() -> None:
    original = pod("a", 1, managedFields=[{"manager": "kubectl"}], labels={"app": "x"})
    out = trimmed(original)
    assert "managedFields" not in out["metadata"]
    assert out["metadata"]["labels"] == {"app": "x"}
    assert out["spec"] == original["spec"]
    assert "managedFields" in original["metadata"]
    plain = pod("b", 1)
    assert trimmed(plain) is plain  # nothing to drop: no copy


def test_metadata_only_keeps_identity_and_owners() -> None:
    refs = [{"kind": "ReplicaSet", "name": "rs", "controller": True}]
    out = metadata_only(pod("a", 7, ownerReferences=refs, labels={"x": "y"}))
    assert out == {
        "kind": "Pod",
        "metadata": {
            "namespace": "ns",
            "name": "a",
            "resourceVersion": "7",
            "ownerReferences": refs,
        },
    }


def test_relist_diff_removes_what_was_deleted_while_the_watch_was_down() -> None:
    cached = {object_key(p): p for p in (pod("kept", 1), pod("changed", 2), pod("gone", 3))}
    store, delta = diff(cached, [pod("kept", 1), pod("changed", 5), pod("new", 6)])
    assert set(store) == {("ns", "kept"), ("ns", "changed"), ("ns", "new")}
    assert store[("ns", "changed")]["metadata"]["resourceVersion"] == "5"
    assert delta == Delta(
        added=(("ns", "new"),), modified=(("ns", "changed"),), deleted=(("ns", "gone"),)
    )
    assert delta
    assert not diff(store, list(store.values()))[1]  # the same list again: nothing changed


def test_a_page_carries_its_version_continue_token_and_the_items_kind() -> None:
    body = {
        "kind": "PodList",
        "metadata": {"resourceVersion": "99", "continue": "abc"},
        "items": [{"metadata": {"name": "a", "managedFields": [{}]}}],
    }
    page = parse_page(body)
    assert page.resource_version == "99"
    assert page.continue_token == "abc"
    assert page.items == [{"metadata": {"name": "a"}, "kind": "Pod"}]
    last = parse_page({"kind": "PodList", "metadata": {"resourceVersion": "99"}, "items": []})
    assert last.continue_token is None
    assert last.items == []


def test_watch_events() -> None:
    line = json.dumps({"type": "ADDED", "object": pod("a", 3, managedFields=[{}])})
    event = parse_event(line)
    assert event is not None
    assert event.type == "ADDED"
    assert "managedFields" not in event.object["metadata"]
    assert parse_event("") is None
    assert parse_event("  ") is None
    bookmark = parse_event(json.dumps({"type": "BOOKMARK", "object": pod("", 9)}))
    assert bookmark is not None
    assert bookmark.type == "BOOKMARK"
    gone = {"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}
    with pytest.raises(WatchExpiredError):
        parse_event(json.dumps(gone))
    with pytest.raises(WatchFailedError):
        parse_event(json.dumps({"type": "ERROR", "object": {"code": 500, "message": "boom"}}))


def test_apply_event() -> None:
    store: dict[tuple[str, str], dict[str, Any]] = {}
    apply_event(store, WatchEvent("ADDED", pod("a", 1)))
    apply_event(store, WatchEvent("MODIFIED", pod("a", 2)))
    assert store[("ns", "a")]["metadata"]["resourceVersion"] == "2"
    apply_event(store, WatchEvent("DELETED", pod("a", 3)))
    assert store == {}
    apply_event(store, WatchEvent("DELETED", pod("never-seen", 4)))  # no error


def test_negative_cache_remembers_a_miss_for_its_ttl() -> None:
    misses = NegativeCache(ttl_s=60)
    assert not misses.known_missing("k", now=0)
    misses.remember("k", now=100)
    assert misses.known_missing("k", now=100)
    assert misses.known_missing("k", now=159.9)
    assert not misses.known_missing("k", now=160)  # expired, and forgotten
    assert len(misses) == 0
    misses.remember("k", now=200)
    misses.forget("k")
    assert not misses.known_missing("k", now=200)


def test_negative_cache_is_bounded_oldest_first() -> None:
    misses = NegativeCache(ttl_s=60, max_entries=3)
    for i in range(5):
        misses.remember(i, now=float(i))
    assert len(misses) == 3
    assert not misses.known_missing(0, now=5)
    assert not misses.known_missing(1, now=5)
    assert all(misses.known_missing(i, now=5) for i in (2, 3, 4))
