"""The policy a workload's engine sizes with under a memory-isolation mode, where the policy
leaves a setting to the mode (docs/sizing.md, "Memory isolation").

- **enforced** (HAMi, KAI with HAMi-core: a pod above its own cap is killed): the learned
  per-pod headroom :data:`ENFORCED_HEADROOM` unless the policy sets ``memory_headroom``, and
  the modes' resize budget unless it sets ``resize_budget_per_day``; a workload still warming
  up starts from the population's prior (:func:`engine_prior`).
- **shared** and **auto**: the policy as it is here; the shared replay's tenant engine
  (``analysis/tenant_sizing.py``) drops the per-pod headroom because its card planner adds a
  pooled one, which the live actuator does only where it divides a card.

The decision service (through :class:`fracpilot_libs.sizing.policies.LivePolicies`), ``fracpilot
recommend`` and ``fracpilot replay`` size a policy that says ``isolation: enforced`` with
:func:`sizing_policy`; the packed replay applies :func:`enforced_policy` (what it adds) by its
``--isolation enforced`` flag or trace column, whatever the policy says. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable

from fracpilot_libs.contracts import (
    MemoryHeadroom,
    MemoryHeadroomMode,
    MemoryIsolation,
    Policy,
)
from fracpilot_libs.sizing.forecast import population_prior

# The resize budget a mode applies when the policy sets none (resizes per workload in 24 h).
MODE_RESIZE_BUDGET = 4.0

# The learned headroom an enforced-isolation engine uses when the policy sets none (tuned on
# half the GenAI trace's pods: docs/sizing.md). A 4 h warm-up on the population's prior: with
# 2 h, pods whose own jumps were still small overran (0.011% on the tuning half).
ENFORCED_HEADROOM = MemoryHeadroom(
    mode=MemoryHeadroomMode.LEARNED, factor=1.0, floor=0.05, cap=0.25, warmup=4 * 3600.0
)
PRIOR_QUANTILE = 0.75  # of the population's jump statistics


# What "left to the mode" means is read from the values, not from which fields a policy was
# built with: a policy that came over NATS or from the KV has every field set (its JSON
# carries them all), so only the built-in value can say the user chose nothing.
_BUILT_IN_HEADROOM = MemoryHeadroom()


def with_resize_budget(policy: Policy, budget: float = MODE_RESIZE_BUDGET) -> Policy:
    """``policy`` with the mode's resize budget, unless it sets its own (None: it sets none)."""
    if policy.resize_budget_per_day is not None:
        return policy
    return policy.model_copy(update={"resize_budget_per_day": budget})


def enforced_policy(policy: Policy) -> Policy:
    """``policy`` with the learned headroom of enforced isolation (where it keeps the built-in
    uniform one) and the modes' resize budget (where it sets none)."""
    if policy.memory_headroom == _BUILT_IN_HEADROOM:
        policy = policy.model_copy(update={"memory_headroom": ENFORCED_HEADROOM})
    return with_resize_budget(policy)


def sizing_policy(policy: Policy) -> Policy:
    """The policy a workload's engine sizes with: enforced isolation's settings where the
    policy says ``isolation: enforced`` and leaves them to the mode; any other policy as it
    is (``auto``: the mode of each pod is the actuator's to detect, the engine does not know
    it)."""
    if policy.isolation is MemoryIsolation.ENFORCED:
        return enforced_policy(policy)
    return policy


def engine_prior(
    jumps: Iterable[tuple[float, float]],
    now: float,
    policy: Policy,
    quantile: float = PRIOR_QUANTILE,
) -> float | None:
    """The population prior a warming-up workload's learned headroom starts from under
    enforced isolation: the ``quantile`` of the jump statistics of the workloads with
    ``warmup`` seconds of history at ``now`` (``jumps``: (first seen, jump statistic) per
    workload); None while none has (the uniform rule then)."""
    warm = policy.memory_headroom.warmup
    ready = [jump for first, jump in jumps if now - first >= warm]
    return population_prior(ready, quantile) if ready else None
