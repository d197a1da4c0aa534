"""The ports of :mod:`fracpilot_actuator.stores.ports` on NATS KV buckets.

- targets: ``subjects.TARGET_BUCKET``, one :class:`WorkloadTarget` per ``kv_key(workload)``;
- disruptions: the actuator's state bucket, key ``guardrails.disruptions``, a JSON list of
  ``{"workload", "namespace", "at"}``;
- allocations: ``subjects.ALLOCATION_BUCKET``, one :class:`Allocation` per workload;
- pending recreates: the actuator's state bucket, key ``verification.recreates``, a JSON object
  of workload key -> record (one key: the leader writes the whole set, and a restart reads it
  with one get, not a scan of the bucket's decision claims);
- consolidation progress: the actuator's state bucket, key ``consolidation.progress``, the JSON
  text of :class:`~fracpilot_actuator.kube.consolidation_progress.Progress` ("" nothing in flight).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime

from fracpilot_actuator.guardrails import Disruption
from fracpilot_actuator.stores.ports import UnreadableHistoryError
from fracpilot_libs.contracts import Allocation, WorkloadRef, WorkloadTarget
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.kv import KvBucket

DISRUPTIONS_KEY = "guardrails.disruptions"  # in the state bucket: recent disruptive actions
RECREATES_KEY = "verification.recreates"  # in the state bucket: recreates waiting to be verified
PROGRESS_KEY = "consolidation.progress"  # in the state bucket: the node or card being emptied


class KvTargetStore:
    def __init__(self, kv: KvBucket) -> None:
        self.kv = kv

    async def get(self, workload: WorkloadRef) -> WorkloadTarget | None:
        entry = await self.kv.get(subjects.kv_key(workload))
        if entry is None:
            return None
        try:
            return WorkloadTarget.model_validate_json(entry.value)
        except ValueError:
            return None

    async def put(self, target: WorkloadTarget) -> None:
        await self.kv.put(subjects.kv_key(target.workload), target.to_json())


class KvDisruptionHistory:
    def __init__(self, kv: KvBucket) -> None:
        self.kv = kv

    async def load(self) -> tuple[Disruption, ...] | None:
        entry = await self.kv.get(DISRUPTIONS_KEY)
        if entry is None:
            return None
        try:
            return tuple(
                Disruption(str(a["workload"]), str(a["namespace"]), datetime.fromisoformat(a["at"]))
                for a in json.loads(entry.value or b"[]")
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise UnreadableHistoryError(str(exc)) from exc

    async def save(self, recent: tuple[Disruption, ...]) -> None:
        body = [
            {"workload": a.workload, "namespace": a.namespace, "at": a.at.isoformat()}
            for a in recent
        ]
        await self.kv.put(DISRUPTIONS_KEY, json.dumps(body).encode())


class KvAllocationStore:
    def __init__(self, kv: KvBucket) -> None:
        self.kv = kv

    async def put(self, allocation: Allocation) -> None:
        await self.kv.put(subjects.kv_key(allocation.workload), allocation.to_json())


class KvPendingRecreates:
    def __init__(self, kv: KvBucket) -> None:
        self.kv = kv

    async def load(self) -> dict[str, str]:
        entry = await self.kv.get(RECREATES_KEY)
        if entry is None:
            return {}
        try:
            records = json.loads(entry.value or b"{}")
            if not isinstance(records, dict):
                raise TypeError(f"a {type(records).__name__}, not an object")
            return {str(key): json.dumps(record) for key, record in records.items()}
        except (ValueError, TypeError) as exc:
            raise UnreadableHistoryError(str(exc)) from exc

    async def save(self, records: Mapping[str, str]) -> None:
        # Nested as objects, not strings, so that `nats kv get` shows them readably.
        body = {key: json.loads(record) for key, record in records.items()}
        await self.kv.put(RECREATES_KEY, json.dumps(body).encode())


class KvConsolidationProgress:
    def __init__(self, kv: KvBucket) -> None:
        self.kv = kv

    async def load(self) -> str:
        entry = await self.kv.get(PROGRESS_KEY)
        return "" if entry is None else (entry.value or b"").decode()

    async def save(self, text: str) -> None:
        await self.kv.put(PROGRESS_KEY, text.encode())
