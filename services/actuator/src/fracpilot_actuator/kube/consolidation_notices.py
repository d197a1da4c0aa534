"""What consolidation (:mod:`.consolidation`) tells the outside, and nothing it does: the
gauges ``fracpilot_consolidation_would_free_gpus`` / ``_nodes``, the plan's summary logged and
published when it changes (a ``ConsolidationReport``), each move's start and result, a plan
given up and a node (card) freed on the event stream (``ConsolidationMove``,
:data:`~fracpilot_libs.nats.subjects.CONSOLIDATION_STREAM`), and Events on nodes. A failure to
tell is logged: consolidation carries on."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any, Protocol

from fracpilot_actuator.kube.api import KubeApi
from fracpilot_actuator.kube.executor import COMPONENT
from fracpilot_actuator.kube.settings import KubeBackendSettings
from fracpilot_actuator.metrics import ConsolidationMetrics
from fracpilot_libs.contracts import (
    ConsolidationMode,
    ConsolidationMove,
    ConsolidationReport,
    MoveState,
    WireModel,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.placement.consolidation_events import consolidation_report, planned_move
from fracpilot_libs.placement.consolidation_steps import ConsolidationPlan, ConsolidationStep

log = logging.getLogger(__name__)

Publish = Callable[[str, WireModel], Awaitable[object]]
"""Publishes a message on a subject (the bus's ``publish``: JetStream, trace context in the
headers)."""


class NoticeHost(Protocol):
    """What the notices read of the backend, at each notice (its settings may change)."""

    api: KubeApi
    settings: KubeBackendSettings
    instance: str


class ConsolidationNotices:
    """Gauges, the event stream and node Events for one backend's consolidation."""

    def __init__(
        self, backend: NoticeHost, metrics: ConsolidationMetrics | None, publish: Publish | None
    ) -> None:
        self.backend = backend
        self.metrics = metrics
        self.publish = publish
        self.last_summary = ""

    async def report(self, would: ConsolidationPlan, node: str, now: datetime) -> None:
        """The plan's gauges; its summary logged and published when it changed."""
        gpus, nodes, summary = would.cards_freed, len(would.freed_nodes), would.summary()
        if self.metrics is not None:
            self.metrics.would_free_gpus.set(gpus)
            self.metrics.would_free_nodes.set(nodes)
        if summary == self.last_summary:
            return  # published when it changes, not every round
        self.last_summary = summary
        log.info(
            "consolidation plan",
            extra={"summary": summary, "would_free_gpus": gpus, "would_free_nodes": nodes},
        )
        cluster = self.backend.settings.cluster
        report: ConsolidationReport = consolidation_report(
            would, cluster=cluster, mode=self._mode(), at=now, node=node
        )
        await self._send(subjects.consolidation_report_subject(cluster), report)

    def _mode(self) -> ConsolidationMode:
        auto = self.backend.settings.consolidation.mode == "auto"
        return ConsolidationMode.AUTO if auto else ConsolidationMode.RECOMMEND

    async def moved(
        self,
        state: MoveState,
        node: str,
        step: ConsolidationStep | None = None,
        detail: str = "",
        **result: Any,
    ) -> None:
        """A move's start or result, a plan given up or a node freed, on the event stream."""
        cluster = self.backend.settings.cluster
        event = ConsolidationMove(
            cluster=cluster,
            state=state,
            node=node,
            move=planned_move(step) if step is not None else None,
            detail=detail[:4000],
            at=datetime.now(UTC),
            **result,
        )
        await self._send(subjects.consolidation_move_subject(cluster), event)

    async def _send(self, subject: str, message: WireModel) -> None:
        if self.publish is None:
            return
        try:
            await self.publish(subject, message)
        except Exception as exc:  # the event stream is a view: consolidation carries on
            log.warning(
                "consolidation event not published",
                extra={"subject": subject, "error": str(exc)[:300]},
            )

    async def node_event(
        self, raw: dict[str, Any] | Any, reason: str, message: str, warning: bool = False
    ) -> None:
        """A Kubernetes Event on a node (in ``default``)."""
        meta = raw.get("metadata") or {}
        name = str(meta.get("name", ""))
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        suffix = hashlib.sha256(f"{reason}{message}{now}".encode()).hexdigest()[:10]
        body = {
            "metadata": {"name": f"{name}.{suffix}"[:253], "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": name, "uid": name},
            "reason": reason,
            "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "fracpilot-actuator"},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.backend.instance,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.backend.api.create_event("default", body)
        except Exception as exc:
            log.warning("could not write an event", extra={"node": name, "error": str(exc)[:300]})
