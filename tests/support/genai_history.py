"""Fourteen days of GPU history for ``fracpilot recommend`` tests, built from the GenAI trace's
pods (``shared/data/genai_public.csv.gz``) and written two ways with the same values:

- as dcgm-exporter's series (:mod:`support.gpu_exporter`'s shape: ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``
  ratio, ``DCGM_FI_DEV_FB_USED`` / ``_FREE`` in MiB, the device labels and the pod's) in
  OpenMetrics text, which ``promtool tsdb create-blocks-from openmetrics`` turns into blocks in
  a Prometheus data dir before the server starts (:func:`backfill`);
- as the replay's CSV trace (:mod:`fracpilot_libs.analysis.trace`), the samples Prometheus gives
  back: memory in whole MiB (dcgm's unit), each sample at the instant a range query at
  :data:`STEP_S` reads it.

Each workload is one pod on a GPU of its own (an 80 GB A100); a workload beyond the trace's
72 pods is another pod's series started elsewhere in it, under a name of its own. A pod's
series repeats to fill the span. Samples are written 1 s after a step boundary, so the range
query's instant at the next boundary reads each one exactly once (Prometheus 2's look-back
includes its left end: a sample on the boundary would be read twice, at its instant and 5
minutes later).
"""

from __future__ import annotations

import csv
import gzip
import shutil
import subprocess
import uuid as uuidlib
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from support.gpu_exporter import MIB

# Beside the checkout (as the benches find it), else the machine's shared copy.
_BESIDE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "genai_public.csv.gz"
GENAI = _BESIDE if _BESIDE.exists() else Path("/work/shared/data/genai_public.csv.gz")
STEP_S = 300.0
DAY_S = 86_400.0
MODEL = "NVIDIA A100-SXM4-80GB"
TOTAL_MIB = 80 * 1024
NAMESPACE = "genai"
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class Workload:
    name: str  # the StatefulSet; its pod is <name>-0
    compute: list[float]  # 0..1 per step
    memory_mib: list[int]  # per step

    @property
    def pod(self) -> str:
        return f"{self.name}-0"


def genai_pods(path: Path = GENAI) -> dict[str, tuple[list[float], list[int]]]:
    """Each pod's compute and memory (MiB, rounded as dcgm rounds) in the trace's order."""
    series: dict[str, tuple[list[float], list[int]]] = defaultdict(lambda: ([], []))
    with gzip.open(path, "rt", newline="") as f:
        for row in csv.DictReader(f):
            compute, memory = series[row["workload"]]
            compute.append(float(row["gpu_util"]))
            memory.append(round(int(row["gpu_mem_used_bytes"]) / MIB))
    return dict(series)


def workloads(count: int, steps: int, path: Path = GENAI) -> list[Workload]:
    pods = genai_pods(path)
    names = sorted(pods)
    out = []
    for i in range(count):
        base = names[i % len(names)]
        compute, memory = pods[base]
        copy = i // len(names)
        start = (copy * 487) % len(compute)  # a copy starts elsewhere in its pod's day
        name = base if copy == 0 else f"{base}-r{copy}"
        index = [(start + j) % len(compute) for j in range(steps)]
        out.append(Workload(name, [compute[k] for k in index], [memory[k] for k in index]))
    return out


def _labels(i: int, w: Workload) -> str:
    gpu = uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"gpu://{w.name}")
    node = f"gpu-node-{i // GPUS_PER_NODE}"
    index = i % GPUS_PER_NODE
    return (
        f'gpu="{index}",UUID="GPU-{gpu}",pci_bus_id="00000000:{0x10 + index:02X}:00.0",'
        f'device="nvidia{index}",modelName="{MODEL}",Hostname="{node}",'
        f'container="main",namespace="{NAMESPACE}",pod="{w.pod}",'
        f'job="dcgm-exporter",instance="{node}:9400"'
    )


BLOCK_S = 7200.0  # promtool's block: it reads its whole input once per block, so one file each


def _sample_time(first_instant: float, j: int) -> float:
    return first_instant + (j - 1) * STEP_S + 1


def openmetrics_text(loads: list[Workload], first_instant: float, steps: range) -> str:
    """The dcgm-exporter series of ``loads`` for the samples ``steps``; sample j at 1 s after
    the step boundary before ``first_instant + j*STEP_S`` (the instant that reads it)."""
    families = (
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", lambda w, j: repr(w.compute[j])),
        ("DCGM_FI_DEV_FB_USED", lambda w, j: str(w.memory_mib[j])),
        ("DCGM_FI_DEV_FB_FREE", lambda w, j: str(TOTAL_MIB - w.memory_mib[j])),
    )
    lines = []
    for name, value in families:
        lines.append(f"# TYPE {name} gauge\n")
        for i, w in enumerate(loads):
            prefix = f"{name}{{{_labels(i, w)}}} "
            lines += [
                f"{prefix}{value(w, j)} {_sample_time(first_instant, j):.0f}\n" for j in steps
            ]
    lines.append("# EOF\n")
    return "".join(lines)


def trace_rows(loads: list[Workload], first_instant: float) -> Iterator[list[object]]:
    """The replay's CSV rows (with ``gpu_model``): each sample at the instant it is read."""
    from datetime import UTC, datetime

    for w in loads:
        for j, (compute, memory) in enumerate(zip(w.compute, w.memory_mib, strict=True)):
            at = datetime.fromtimestamp(first_instant + j * STEP_S, UTC)
            yield [
                at.isoformat().replace("+00:00", "Z"),
                NAMESPACE,
                w.name,
                w.pod,
                repr(compute),
                memory * MIB,
                TOTAL_MIB * MIB,
                MODEL,
            ]


def promtool() -> str:
    found = shutil.which("promtool") or "/usr/bin/promtool"
    if not Path(found).exists():
        raise FileNotFoundError("promtool not found (Debian's prometheus package has it)")
    return found


def backfill(loads: list[Workload], first_instant: float, data_dir: Path, work: Path) -> int:
    """Blocks of ``loads``' series in a Prometheus data dir (run before the server starts),
    made by Prometheus' own tool, one OpenMetrics file per block. Returns the samples written."""
    data_dir.mkdir(parents=True, exist_ok=True)
    steps = len(loads[0].compute)
    by_block: dict[int, list[int]] = defaultdict(list)
    for j in range(steps):
        by_block[int(_sample_time(first_instant, j) // BLOCK_S)].append(j)
    written = 0
    for block, js in sorted(by_block.items()):
        path = work / f"block-{block}.om"
        path.write_text(openmetrics_text(loads, first_instant, range(js[0], js[-1] + 1)))
        subprocess.run(
            [
                promtool(),
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "-q",
                str(path),
                str(data_dir),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        path.unlink()
        written += 3 * len(loads) * len(js)
    return written
