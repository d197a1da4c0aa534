"""The pure parts of the informer: object keys, trimming, the diff of a relist against the
cache, list pages, watch events and the negative cache of lookups.

No I/O and no clock: :mod:`fracpilot_libs.kube.informer` feeds these what the API returned and
the time it is.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Key = tuple[str, str]  # (namespace or "", name)
Obj = dict[str, Any]  # an object as the API's JSON has it
Project = Callable[[Obj], Obj]  # what of an object a cache keeps


class WatchExpiredError(Exception):
    """The resourceVersion (or continue token) is too old (410 Gone): list again."""


class WatchFailedError(Exception):
    """The watch stream reported an error other than 410."""


def object_key(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def resource_version(value: Any) -> int:
    """A resourceVersion as a number (0 when missing or not a number)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def object_version(obj: Mapping[str, Any]) -> int:
    return resource_version((obj.get("metadata") or {}).get("resourceVersion"))


def trimmed(obj: Obj) -> Obj:
    """The object without ``metadata.managedFields`` (often half its size, never read)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    return obj


def metadata_only(obj: Obj) -> Obj:
    """Keep only the identity, version and owner references (what an owners cache reads)."""
    meta = obj.get("metadata") or {}
    kept = ("namespace", "name", "resourceVersion", "ownerReferences")
    return {"kind": obj.get("kind"), "metadata": {k: meta[k] for k in kept if k in meta}}


@dataclass(frozen=True, slots=True)
class Delta:
    """What a relist changed in the cache."""

    added: tuple[Key, ...] = ()
    modified: tuple[Key, ...] = ()
    deleted: tuple[Key, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.modified or self.deleted)


def diff(cached: Mapping[Key, Obj], listed: Iterable[Obj]) -> tuple[dict[Key, Obj], Delta]:
    """The cache after a relist and what changed: an object not in the list was deleted while
    the watch was down, one whose resourceVersion differs was modified."""
    store = {object_key(obj): obj for obj in listed}
    added = tuple(k for k in store if k not in cached)
    modified = tuple(
        k
        for k, obj in store.items()
        if k in cached and object_version(cached[k]) != object_version(obj)
    )
    deleted = tuple(k for k in cached if k not in store)
    return store, Delta(added, modified, deleted)


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a paged list (``limit``/``continue``)."""

    items: list[Obj]
    resource_version: str
    continue_token: str | None


def parse_page(body: Mapping[str, Any], project: Project = trimmed) -> Page:
    meta = body.get("metadata") or {}
    kind = str(body.get("kind") or "").removesuffix("List")
    items = []
    for item in body.get("items") or ():
        if kind and "kind" not in item:  # items of a list carry no kind: the list's says it
            item = {**item, "kind": kind}
        items.append(project(item))
    return Page(items, str(meta.get("resourceVersion") or ""), meta.get("continue") or None)


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: Obj


def parse_event(line: str | bytes, project: Project = trimmed) -> WatchEvent | None:
    """One line of a watch stream; None for a blank line (a keep-alive).

    Raises :class:`WatchExpiredError` on 410 Gone and :class:`WatchFailedError` on any other error.
    """
    if not line or line.isspace():
        return None
    event = json.loads(line)
    kind, obj = str(event.get("type") or ""), event.get("object") or {}
    if kind == "ERROR":
        if obj.get("code") == 410:
            raise WatchExpiredError(str(obj.get("message") or "410 Gone"))
        raise WatchFailedError(f"watch error: {obj.get('message', obj)}")
    return WatchEvent(kind, obj if kind == "BOOKMARK" else project(obj))


def apply_event(store: dict[Key, Obj], event: WatchEvent) -> None:
    if event.type == "DELETED":
        store.pop(object_key(event.object), None)
    elif event.type in ("ADDED", "MODIFIED"):
        store[object_key(event.object)] = event.object


@dataclass
class NegativeCache:
    """Keys looked up and not found, remembered for ``ttl_s`` so a miss costs one lookup, not
    one per sample. Bounded: the oldest entries go first."""

    ttl_s: float
    max_entries: int = 10_000
    _until: OrderedDict[Hashable, float] = field(default_factory=OrderedDict)

    def remember(self, key: Hashable, now: float) -> None:
        self._until.pop(key, None)
        self._until[key] = now + self.ttl_s
        while len(self._until) > self.max_entries:
            self._until.popitem(last=False)

    def known_missing(self, key: Hashable, now: float) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if until <= now:
            del self._until[key]
            return False
        return True

    def forget(self, key: Hashable) -> None:
        self._until.pop(key, None)

    def __len__(self) -> int:
        return len(self._until)
