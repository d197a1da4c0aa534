"""Which pods a consolidation round may move and which it may shrink in place: the opt-in
rule and what the live part moves (:func:`pins`), shared isolation's shrinkable tenants
(:func:`shrinkable`, given the forecasts :func:`card_forecasts` keeps) and the card budget they
give the planner (:func:`shared_card_budget`).
The rules are told in :mod:`.consolidation_round`'s docstring. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from fracpilot_actuator.kube.card_division import LIVE_RULES, STEP, fixed_need, tenant_forecast
from fracpilot_actuator.kube.consolidation_view import ConsolidationView
from fracpilot_actuator.kube.enforcement import enforcement_of
from fracpilot_actuator.kube.inventory import PodInfo
from fracpilot_actuator.kube.kai import is_multi_device
from fracpilot_actuator.kube.object_values import KAI_FRACTION, is_opted_out
from fracpilot_actuator.opt_in import Automation, automation_of
from fracpilot_actuator.settings import OptInSettings
from fracpilot_actuator.stores.forecasts import ForecastBook
from fracpilot_libs.contracts import CardForecast, GpuSharing, MemoryIsolation, Mode
from fracpilot_libs.owners import Controller, OwnerKey, top_owner
from fracpilot_libs.placement.card_budget import TenantForecast, divide, fits
from fracpilot_libs.placement.consolidation_limits import CardBudget


def _stays(pod: PodInfo) -> str | None:
    """Why the live part never moves this pod (None: it may)."""
    if pod.terminating:
        return "it is terminating"
    if pod.controller is None:
        return "no controller would recreate it"
    share = pod.share
    if pod.backend is not GpuSharing.KAI or share is None or share.kai_key != KAI_FRACTION:
        return "consolidation moves KAI gpu-fraction pods only"
    if is_multi_device(pod.annotations, pod.labels):
        return "a multi-device fraction"
    return None


def pins(view: ConsolidationView, opt_in: OptInSettings) -> tuple[dict[str, str], dict[str, str]]:
    """Pods that stay whatever the mode (off, or never moved live) and, besides those, the
    pods that stay in auto mode because they are not opted in."""
    always: dict[str, str] = {}
    unless_opted_in: dict[str, str] = {}
    placed = {p.pod_key for p in view.inventory.state.placements}
    for key in placed:
        pod = view.inventory.pods.get(key)
        if pod is None:
            always[key] = "a fracpilot placeholder"
            continue
        if (why := _stays(pod)) is not None:
            always[key] = why
            continue
        if is_opted_out(pod.raw):
            always[key] = "opted out (fracpilot.io/opt-out)"
            continue
        selected = automation_of(
            pod.namespace,
            view.namespace_labels.get(pod.namespace, {}),
            [pod.labels],
            Mode.AUTO,
            opt_in,
            pods=[pod.name],
        )
        if selected.mode is Automation.OFF:
            always[key] = f"off: {selected.reason}"
        elif not selected.applies:
            unless_opted_in[key] = selected.reason
    return always, unless_opted_in


def shrinkable(
    view: ConsolidationView,
    forecasts: Mapping[str, CardForecast],
    always: Mapping[str, str],
    unless_opted_in: Mapping[str, str],
) -> dict[str, TenantForecast]:
    """The pods that may shrink in place, with their forecasts: a forecast given (the caller
    keeps only an auto policy's, isolation not ``enforced``), a pod that may move (not
    pinned by :func:`pins`) and whose memory nothing enforces (a limit it refers to and that
    is not read here counts as enforced)."""
    out: dict[str, TenantForecast] = {}
    for key, forecast in forecasts.items():
        pod = view.inventory.pods.get(key)
        if pod is None or key in always or key in unless_opted_in:
            continue
        enforced = enforcement_of(pod, {}, 0)
        if enforced.enforced or enforced.unknown:
            continue
        out[key] = tenant_forecast(forecast)
    return out


def card_forecasts(
    book: ForecastBook,
    view: ConsolidationView,
    owners: Mapping[OwnerKey, Controller],
    now: datetime,
) -> dict[str, CardForecast]:
    """Each KAI pod's card forecast, its workload's last decision's (the decisions seen by
    this process: :class:`~fracpilot_actuator.stores.forecasts.ForecastBook`), when that
    decision's policy is auto and its isolation not ``enforced`` (what :func:`shrinkable`
    is given)."""
    if not len(book):
        return {}
    out: dict[str, CardForecast] = {}
    for pod in view.inventory.pods.values():
        if pod.backend is not GpuSharing.KAI or pod.terminating:
            continue
        kind, name = top_owner(pod.namespace, pod.controller, owners, pod.name)
        known = book.get((pod.namespace, kind, name), now)
        if known is None or known.mode is not Mode.AUTO:
            continue
        if known.isolation is MemoryIsolation.ENFORCED:
            continue
        out[pod.key] = known.forecast
    return out


def shared_card_budget(tenants: Mapping[str, TenantForecast]) -> CardBudget:
    """The planner's card budget from the shrinkable ``tenants`` (:func:`shrinkable`): on a
    card that holds one, the card planner's division with the peaks summed (each keeps at
    least its predicted need: :data:`~.card_division.LIVE_RULES`), every other tenant a fixed
    need that keeps its fraction; a card without one is not budgeted (each keeps its own)."""

    def budget(gpu_uuid: str, held: Mapping[str, float]) -> Mapping[str, float] | None:
        del gpu_uuid  # every card is one whole GPU
        if not any(k in tenants for k in held):
            return dict(held)
        known = {k: tenants.get(k) or fixed_need(f) for k, f in held.items()}
        if not fits(known.values(), LIVE_RULES):
            return None
        shares = divide(known, LIVE_RULES)
        return {k: max(STEP, shares[k]) if k in tenants else f for k, f in held.items()}

    return budget
