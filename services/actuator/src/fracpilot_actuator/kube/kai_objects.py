"""Reads KAI-Scheduler's own objects for a decision: its BindRequests (where a pod not bound
yet is going), its Queues (quota, limit, allocated) and its PodGroups (a gang's minMember, the
queue KAI charges). The parsing is pure (:mod:`.kai`, :mod:`.queues`, :mod:`.gangs`); this is
the I/O, through :meth:`KubeApi.list_kai_objects`.

With the inventory cache on, they come from its watches (:meth:`InventoryCache.kai_objects
<fracpilot_actuator.kube.cache.InventoryCache.kai_objects>`, through :class:`KaiObjectsCache`),
and are listed only while the cache cannot say (starting, or no RBAC to watch them).

A cluster without KAI's CRDs (a HAMi cluster) or without the RBAC for them reads as "no
BindRequests", "Queues unknown" (no queue check) and "PodGroups unknown" (no gang check; the
queue from labels), logged once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from fracpilot_actuator.kube.gangs import (
    POD_GROUP_GROUP,
    POD_GROUP_PLURAL,
    POD_GROUP_VERSION,
    PodGroup,
    parse_pod_groups,
)
from fracpilot_actuator.kube.kai import (
    BIND_REQUEST_GROUP,
    BIND_REQUEST_PLURAL,
    BIND_REQUEST_VERSION,
    BindTarget,
    bind_targets,
)
from fracpilot_actuator.kube.queues import (
    QUEUE_GROUP,
    QUEUE_PLURAL,
    QUEUE_VERSION,
    Queue,
    parse_queues,
)
from fracpilot_libs.kai import KaiSettings

log = logging.getLogger(__name__)


class KaiObjectsApi(Protocol):
    async def list_kai_objects(
        self, group: str, version: str, plural: str
    ) -> list[dict[str, Any]] | None: ...


@dataclass(frozen=True)
class CachedKaiObjects:
    """KAI objects of one kind as a watch-fed cache holds them."""

    items: list[dict[str, Any]] | None
    """None: not served (the CRD is not installed)."""


class KaiObjectsCache(Protocol):
    def kai_objects(self, plural: str) -> CachedKaiObjects | None:
        """The cached objects; None when the cache cannot say (then they are listed)."""
        ...


@dataclass(frozen=True)
class KaiObjects:
    bound: Mapping[str, BindTarget] = field(default_factory=dict)
    """Pods KAI chose a node for that are not bound yet, by ``ns/pod``."""
    queues: Mapping[str, Queue] | None = None
    """KAI's Queues by name; None: not read (off, or not served to us)."""
    pod_groups: Mapping[str, PodGroup] | None = None
    """KAI's PodGroups by ``ns/name``; None: not read (off, or not served to us)."""


class KaiReader:
    """BindRequests, Queues and PodGroups (as the settings say) for each decision: from
    ``cache`` when it has them, else listed."""

    def __init__(
        self, api: KaiObjectsApi, settings: KaiSettings, cache: KaiObjectsCache | None = None
    ) -> None:
        self.api = api
        self.settings = settings
        self.cache = cache
        self.lists = 0  # list calls made (none while the cache has them)
        self._logged: set[str] = set()

    def _once(self, message: str, **extra: Any) -> None:
        if message not in self._logged:
            self._logged.add(message)
            log.warning(message, extra=extra)

    async def _list(self, wanted: bool, group: str, version: str, plural: str) -> Any:
        if not wanted:
            return None
        cached = self.cache.kai_objects(plural) if self.cache is not None else None
        if cached is not None:
            found = cached.items
        elif hasattr(self.api, "list_kai_objects"):
            self.lists += 1
            found = await self.api.list_kai_objects(group, version, plural)
        else:
            return None
        if found is None:
            self._once(f"KAI {plural} not served (CRD not installed, or no RBAC): not read")
        return found

    async def read(self) -> KaiObjects:
        s = self.settings
        requests, queue_objects, group_objects = await asyncio.gather(
            self._list(
                s.read_bind_requests, BIND_REQUEST_GROUP, BIND_REQUEST_VERSION, BIND_REQUEST_PLURAL
            ),
            self._list(s.read_queues, QUEUE_GROUP, QUEUE_VERSION, QUEUE_PLURAL),
            self._list(s.read_pod_groups, POD_GROUP_GROUP, POD_GROUP_VERSION, POD_GROUP_PLURAL),
        )
        queues = None
        if queue_objects is not None:
            queues, problems = parse_queues(queue_objects)
            for problem in problems:
                self._once("KAI queue not read", problem=problem)
        groups = parse_pod_groups(group_objects) if group_objects is not None else None
        return KaiObjects(bind_targets(requests or ()), queues, groups)
