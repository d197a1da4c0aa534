"""How much two-part sizing on HAMi (a memory share and a compute share per pod, each on its
own sum per GPU) would raise the enforced row's ceiling: card-hours saved when the shares held
at each instant are repacked from scratch (free moves), one number per pod against two.

Runs the enforced packed replay (``fracpilot replay FILE --pack --isolation enforced``'s
fracpilot sizer) on the whole file and on the halves of docs/sizing.md (sorted keys: even
positions train, odd other), records at every sample the fraction held and the engine's need
after the sample (:func:`fracpilot_libs.sizing.engine.need_of`), and repacks with
:func:`fracpilot_libs.analysis.packing_bound.two_part_bound`:

- ``1-D held``: the fraction held, both parts (reproduces the 17.5% of docs/sizing.md);
- ``1-D need``: the need (never above the fraction held), both parts (the 28.9%);
- ``2-D held, other part at its need``: the larger part (the one that sized the fraction) held
  at the fraction, the other at its own part of the need (never above the fraction);
- ``2-D held, same slack``: each part held at its need plus what the fraction held above the
  need (the downsize band, hold and budget), never above the fraction;
- ``2-D need``: each part at its need (never above the fraction held);
- ``memory only, held`` / ``memory only, need``: the memory part of the two variants above with
  compute free (1 %): what no split of compute can beat;
- ``floor 1%``: the 2-D variants with the policy's ``min_fraction`` (0.1) applied to the larger
  part only, the other part down to HAMi's 1 %.

Parts are the engine's (:func:`~fracpilot_libs.analysis.packing_bound.engine_parts`), HAMi's
whole percents rounded up. Usage: ``python bench/hami_two_part_bound.py [TRACE]``.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fracpilot_libs.analysis.enforced_packing import PopulationSizer, enforced_policy
from fracpilot_libs.analysis.packing_bound import engine_parts, held_parts, two_part_bound
from fracpilot_libs.analysis.packing_replay import replay_packed
from fracpilot_libs.analysis.trace import TracePoint, group_by_workload, read_trace
from fracpilot_libs.contracts import Policy, UsageSample
from fracpilot_libs.placement.card_budget import Isolation
from fracpilot_libs.sizing.engine import need_of
from fracpilot_libs.sizing.need import Need
from fracpilot_libs.sizing.state import WorkloadState

DATA = Path(__file__).resolve().parents[1].parent / "shared/data/genai_public.csv.gz"
LOW = 0.01  # HAMi's least request: 1 %


@dataclass
class RecordingSizer(PopulationSizer):
    """The enforced replay's sizer, recording (held, memory part, compute part) per sample."""

    seen: dict[str, list[tuple[float, Need]]] = field(default_factory=dict)

    def step(self, state: WorkloadState, sample: UsageSample) -> tuple[WorkloadState, float | None]:
        state, new = super().step(state, sample)
        held = sample.allocated_fraction
        assert held is not None
        self.seen.setdefault(sample.workload.key, []).append((held, need_of(state, self.policy)))
        return state, new


def variants(
    seen: dict[str, list[tuple[float, Need]]], policy: Policy
) -> dict[str, dict[str, list[tuple[float, float]]]]:
    names = ["1d_held", "1d_need", "2d_held_other_at_need", "2d_held_same_slack", "2d_need"]
    names += ["memory_only_held", "memory_only_need"]
    names += ["2d_held_other_at_need_floor_1pct", "2d_need_floor_1pct"]
    out: dict[str, dict[str, list[tuple[float, float]]]] = {name: {} for name in names}
    low = policy.model_copy(update={"min_fraction": LOW})
    for key, rows in seen.items():
        for name in out:
            out[name][key] = []
        for f, need in rows:
            m, c = engine_parts(need, policy)
            n = max(m, c)  # need_of's fraction
            assert abs(n - need.fraction) < 1e-9
            m1, c1 = engine_parts(need, low)  # the larger part keeps min_fraction
            m1, c1 = (n, c1) if m >= c else (m1, n)
            out["2d_need_floor_1pct"][key].append((min(f, m1), min(f, c1)))
            out["2d_held_other_at_need_floor_1pct"][key].append(
                (f, min(f, c1)) if m >= c else (min(f, m1), f)
            )
            out["memory_only_held"][key].append((f if m >= c else min(f, m), LOW))
            out["memory_only_need"][key].append((min(f, m), LOW))
            out["1d_held"][key].append((f, f))
            out["1d_need"][key].append((min(f, n), min(f, n)))
            out["2d_need"][key].append((min(f, m), min(f, c)))
            out["2d_held_other_at_need"][key].append(held_parts(f, need, policy))
            slack = f - n
            out["2d_held_same_slack"][key].append(
                (min(f, max(LOW, m + slack)), min(f, max(LOW, c + slack)))
            )
    return out


def measure(groups: dict[str, list[TracePoint]]) -> dict[str, object]:
    sizer = RecordingSizer(enforced_policy(Policy()))
    report = replay_packed(groups, sizer, isolation=Isolation.ENFORCED)
    for key, series in groups.items():  # every sample was placed and stepped once
        assert len(sizer.seen[key]) == len(series), key
    out: dict[str, object] = {"packed_card_hours_saved_pct": report.packed.card_hours_saved_pct}
    dominant = {"memory": 0, "compute": 0}
    for rows in sizer.seen.values():
        for _, need in rows:
            m, c = engine_parts(need, sizer.policy)
            dominant["memory" if m >= c else "compute"] += 1
    out["samples_sized_by"] = dominant
    for name, shares in variants(sizer.seen, sizer.policy).items():
        bound = two_part_bound(groups, shares)
        out[name] = {
            "whole_card_hours": round(bound.whole_card_hours, 3),
            "fraction_hours": round(bound.fraction_hours, 3),
            **{
                f"saved_pct_ffd_{o}": round(bound.saved_pct(h), 3)
                for o, h in bound.card_hours.items()
            },
        }
    return out


def main() -> None:
    trace = Path(sys.argv[1]) if len(sys.argv) > 1 else DATA
    groups = group_by_workload(read_trace(trace))
    keys = sorted(groups)
    parts = {
        "whole": groups,
        "train": {k: groups[k] for k in keys[0::2]},
        "other": {k: groups[k] for k in keys[1::2]},
    }
    for name, part in parts.items():
        started = time.perf_counter()
        result = measure(part)
        result["seconds"] = round(time.perf_counter() - started, 1)
        print(json.dumps({name: result}), flush=True)


if __name__ == "__main__":
    main()
