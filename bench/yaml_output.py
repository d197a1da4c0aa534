"""``-o yaml`` for ten thousand status rows: libyaml's emitter next to PyYAML's pure-Python one.

Usage: python bench/yaml_output.py [--rows N] [--repeat N]

Builds N status rows (default 10,000; random values in every field) and the document
``fracpilot status -o yaml`` prints, then times, best of ``--repeat``, wall and CPU seconds:

- ``yaml, SafeDumper`` (the baseline): PyYAML's pure-Python safe dumper;
- ``yaml, CSafeDumper``: the same representer with libyaml's emitter, what the CLI uses
  (``fracpilot_cli.output.yaml_dumper``); its output is checked to be byte-identical;
- ``json`` and ``table`` of the same rows, for scale.

Each line gives its ratio to the baseline (below 1: faster). CPU time is the steadier figure
on a shared machine.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import yaml

from fracpilot_cli import output, render
from fracpilot_cli.status import Risk, StatusRow

T0 = datetime(2026, 3, 2, tzinfo=UTC)


def status_rows(n: int, rng: random.Random) -> list[StatusRow]:
    def maybe(value: float) -> float | None:
        return None if rng.random() < 0.1 else value

    return [
        StatusRow(
            cluster="prod",
            namespace=f"team-{i % 40}",
            workload=f"chat-llama-{i}",
            kind="Deployment",
            fraction=maybe(rng.choice([0.25, 0.375, 0.5, 0.75, 1.0])),
            gpu_memory_bytes=42_949_672_960,
            device_memory_bytes=85_899_345_920,
            node=f"gpu-node-{i % 500}",
            gpu=f"GPU-{rng.getrandbits(64):016x}",
            gpu_model="NVIDIA H100 80GB HBM3",
            compute_percentile=95.0,
            compute_p=maybe(rng.random()),
            memory_peak=maybe(rng.random()),
            compute_of_fraction=maybe(rng.random()),
            memory_of_fraction=maybe(rng.random()),
            usage_basis="engine",
            target=maybe(rng.choice([0.25, 0.375, 0.5])),
            state=rng.choice(["steady", "waiting", "upsizing"]),
            wait_s=maybe(rng.uniform(0, 3600)),
            held_by="",
            requested=None,
            last_plan="in_place",
            last_outcome="applied",
            last_fraction_before=0.5,
            last_fraction_after=0.375,
            last_action_at=T0 + timedelta(seconds=i),
            last_error=None if i % 50 else "eviction refused: PodDisruptionBudget «web»",
            usd_per_gpu_hour=2.5,
            saved_usd_month=maybe(rng.uniform(0, 2000)),
            would_save_usd_month=maybe(rng.uniform(-500, 500)),
            risk=rng.choice(list(Risk)),
            samples=rng.randint(0, 10_000),
            last_sample_at=T0 + timedelta(seconds=i, milliseconds=250),
            policy_scope="cluster",
            policy_revision=3,
        )
        for i in range(n)
    ]


def best(repeat: int, fn: Callable[[], object]) -> tuple[float, float, object]:
    """Best wall and CPU seconds of ``repeat`` runs, and the last result."""
    walls, cpus, result = [], [], None
    for _ in range(repeat):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result = fn()
        walls.append(time.perf_counter() - wall0)
        cpus.append(time.process_time() - cpu0)
    return min(walls), min(cpus), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows = status_rows(args.rows, random.Random(7))
    document = render.status_document(rows, T0)
    cases: list[tuple[str, Callable[[], object]]] = [
        ("yaml, SafeDumper (base)", lambda: output.to_yaml(document, dumper=yaml.SafeDumper)),
        ("yaml, CSafeDumper (CLI)", lambda: output.to_yaml(document, dumper=output.yaml_dumper())),
        ("json", lambda: output.to_json(document)),
        ("table", lambda: render.status_lines(rows)),
    ]
    print(
        f"{args.rows:,} status rows; best of {args.repeat}; PyYAML {yaml.__version__} "
        f"(libyaml: {yaml.__with_libyaml__}, CLI dumper: {output.yaml_dumper().__name__}); "
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    timings = [(name, *best(args.repeat, fn)) for name, fn in cases]
    base_wall, base_cpu = timings[0][1], timings[0][2]
    print(f"{'':<26}{'wall s':>8}{'CPU s':>8}{'wall/base':>11}{'CPU/base':>10}")
    for name, wall, cpu, _ in timings:
        print(f"{name:<26}{wall:>8.3f}{cpu:>8.3f}{wall / base_wall:>11.2f}{cpu / base_cpu:>10.2f}")
    same = timings[0][3] == timings[1][3]
    print(f"CSafeDumper output byte-identical to SafeDumper's: {same}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
