"""OOM and contention events on samples: one event, one signalled sample.

The engine upsizes at once on a sample whose ``signals`` say ``oom_event`` or
``contention_event`` (:mod:`fracpilot_libs.sizing.engine`), so each event must reach exactly
one sample of its pod:

- **OOM**: a container whose last termination was ``OOMKilled`` or a CUDA out-of-memory exit
  (ingest reads them from its pods cache); a kill is identified by its pod, container
  and finish time, and one older than ``window_s`` when first seen (ingest restarted since)
  is history, not news.
- **Contention**: vLLM's ``vllm:num_preemptions_total`` went up since the pod's previous
  published sample (a counter: a drop is a restart, not an event; the first value seen only
  sets the baseline).

The event waits for the pod's next published sample; it is consumed only when that sample is
published (a rejected sample leaves it pending).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime

from fracpilot_libs.usage.attribution import Observation

PodRef = tuple[str, str]  # (namespace, pod)


@dataclass(frozen=True, slots=True)
class OomKill:
    """One out-of-memory exit of a container (ingest reads them from the pods cache)."""

    namespace: str
    pod: str
    container: str
    finished_at: str  # RFC 3339, as the API has it (identifies the kill)


def _finished(kill: OomKill) -> float | None:
    try:
        return datetime.fromisoformat(kill.finished_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass
class SignalTracker:
    """Pending OOM events and the last published preemption count, per pod."""

    window_s: float = 600.0
    pending_oom: set[PodRef] = field(default_factory=set)
    seen_kills: dict[OomKill, float] = field(default_factory=dict)  # kill -> when first seen
    # pod -> (last published count, when): a pod unseen for twice the window is forgotten
    preemptions: dict[PodRef, tuple[float, float]] = field(default_factory=dict)

    def note_kills(self, kills: Iterable[OomKill], now: float) -> None:
        """Kills not seen before (and not older than the window) become pending events; call
        once per reading."""
        for kill in kills:
            if kill in self.seen_kills:
                continue
            self.seen_kills[kill] = now
            finished = _finished(kill)
            if finished is None or now - finished <= self.window_s:
                self.pending_oom.add((kill.namespace, kill.pod))
        # A kill older than the window cannot become news again: forget it; and the counts of
        # pods gone.
        for kill in [k for k, at in self.seen_kills.items() if now - at > 2 * self.window_s]:
            del self.seen_kills[kill]
        for ref in [r for r, (_, at) in self.preemptions.items() if now - at > 2 * self.window_s]:
            del self.preemptions[ref]

    def mark(self, obs: Observation) -> Observation:
        """The observation with the events its pod has pending (nothing is consumed)."""
        if obs.preemptions_total is None and not self.pending_oom:
            return obs  # no counter to compare, no kill pending: most samples
        ref = (obs.pod.namespace, obs.pod.pod)
        last = self.preemptions.get(ref)
        contention = (
            obs.preemptions_total is not None
            and last is not None
            and obs.preemptions_total > last[0]
        )
        oom = ref in self.pending_oom
        if not (oom or contention):
            return obs
        return replace(obs, oom_event=oom, contention_event=contention)

    def published(self, obs: Observation, now: float) -> None:
        """The observation's sample is on NATS: its events are spent."""
        ref = (obs.pod.namespace, obs.pod.pod)
        if obs.oom_event:
            self.pending_oom.discard(ref)
        if obs.preemptions_total is not None:
            self.preemptions[ref] = (obs.preemptions_total, now)

    def published_all(self, observations: Iterable[Observation | None], now: float) -> None:
        """:meth:`published` for each observation of a batch (None: a sample of none); most
        carry no event, and those cost no call."""
        for obs in observations:
            if obs is not None and (obs.oom_event or obs.preemptions_total is not None):
                self.published(obs, now)
