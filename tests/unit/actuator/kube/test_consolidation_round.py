"""One consolidation round (pure): the opt-in rule, the modes, the limits, the mark, PDBs, the
autoscaler's opt-outs, and the verdict on a moved pod's replacement.

The cluster: nodes n1 and n2 (2 GPUs each), Deployment chat's two pods (ReplicaSet chat-rs) at
0.25 GPU, chat-0 on n1's GPU A and chat-1 on n2's GPU B, a PDB allowing one disruption.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fracpilot_actuator.kube.consolidation_moves import MoveInFlight, move_verdict
from fracpilot_actuator.kube.consolidation_pods import shrinkable
from fracpilot_actuator.kube.consolidation_progress import (
    Progress,
    progress_json,
    progress_of,
    resume_refusal,
)
from fracpilot_actuator.kube.consolidation_round import MARK_TAINT, consolidation_round
from fracpilot_actuator.kube.consolidation_view import ConsolidationView, disruption_budgets
from fracpilot_actuator.kube.inventory import Inventory, build_inventory
from fracpilot_actuator.settings import ConsolidationSettings, OptInSettings
from fracpilot_libs.contracts import CardForecast
from fracpilot_libs.placement.consolidation import SCALE_DOWN_DISABLED
from fracpilot_libs.placement.consolidation_steps import StepKind
from support.kube_objects import T0, node, pod, reservation

UUID_A, UUID_B = "GPU-a", "GPU-b"
AUTO_NS = {"inference": {"fracpilot.io/mode": "auto"}}
OPT_IN = OptInSettings()  # recommend unless labelled
AUTO = ConsolidationSettings(mode="auto")
NOW = T0 + timedelta(hours=1)


def chat(name: str, node_name: str, group: str, **labels: str) -> dict[str, Any]:
    return pod(
        name,
        node_name=node_name,
        annotations={"gpu-fraction": "0.25"},
        labels={"runai-gpu-group": group, "app": "chat", **labels},
        owner=("ReplicaSet", "chat-rs"),
    )


def pdb(allowed: int | None, selector: dict[str, Any] | None = None) -> dict[str, Any]:
    status = {} if allowed is None else {"disruptionsAllowed": allowed}
    return {
        "metadata": {"name": "chat", "namespace": "inference"},
        "spec": {"selector": {"matchLabels": {"app": "chat"}} if selector is None else selector},
        "status": status,
    }


def cluster(
    *,
    pods: list[dict[str, Any]] | None = None,
    node_notes: dict[str, str] | None = None,
    marked: str = "",
) -> tuple[Inventory, dict[str, dict[str, Any]]]:
    nodes = {n: node(n, gpus=2) for n in ("n1", "n2")}
    for name, raw in nodes.items():
        raw["metadata"]["annotations"] = dict(node_notes or {})
        if name == marked:
            raw["spec"] = {"taints": [{"key": MARK_TAINT, "value": "true", "effect": "NoSchedule"}]}
    if pods is None:
        pods = [chat("chat-0", "n1", "g1"), chat("chat-1", "n2", "g2")]
    objects = [reservation("g1", UUID_A, "n1"), reservation("g2", UUID_B, "n2"), *pods]
    inventory = build_inventory(
        list(nodes.values()), objects, cluster="test", default_gpu_memory_mib=81920
    )
    return inventory, nodes


def view(
    *,
    allowed: int | None = 1,
    labels: dict[str, dict[str, str]] | None = None,
    **kw: Any,
) -> ConsolidationView:
    inventory, nodes = cluster(**kw)
    return ConsolidationView(
        inventory=inventory,
        nodes=nodes,
        budgets=disruption_budgets([pdb(allowed)], inventory.pods.values()),
        namespace_labels=AUTO_NS if labels is None else labels,
    )


def round_of(
    v: ConsolidationView,
    settings: ConsolidationSettings = AUTO,
    marked: str = "",
    recent: tuple[Any, ...] = (),
) -> Any:
    return consolidation_round(v, settings, OPT_IN, marked=marked, recent_moves=recent, now=NOW)


def test_recommend_mode_moves_nothing_and_says_what_it_would_free() -> None:
    done = round_of(view(), ConsolidationSettings(mode="recommend"))
    assert (done.would_free_gpus, done.would_free_nodes) == (1, 1)
    assert (done.step, done.mark, done.held_back) == (None, "", "recommend mode")


def test_auto_marks_the_cheapest_node_and_moves_its_pod_where_kai_would_put_it() -> None:
    done = round_of(view())
    assert done.node == "n1"
    assert "autoscaler can remove it" in done.mark
    assert done.step is not None
    assert done.step.kind is StepKind.MOVE
    assert (done.step.pod_key, done.step.to_gpu, done.step.to_node) == (
        "inference/chat-0",
        UUID_B,
        "n2",
    )


def test_pods_not_opted_in_stay_in_auto_mode_but_count_in_what_would_be_freed() -> None:
    done = round_of(view(labels={}))
    assert (done.step, done.would_free_nodes) == (None, 1)
    assert "inference/chat-0 stays: not opted in" in done.held_back


def test_an_opted_out_pod_is_not_counted_as_movable_at_all() -> None:
    pods = [
        chat("chat-0", "n1", "g1", **{"fracpilot.io/opt-out": "true"}),
        chat("chat-1", "n2", "g2", **{"fracpilot.io/opt-out": "true"}),
    ]
    done = round_of(view(pods=pods))
    assert (done.step, done.would_free_nodes, done.would_free_gpus) == (None, 0, 0)


def test_scale_down_disabled_nodes_are_never_emptied() -> None:
    done = round_of(view(node_notes={SCALE_DOWN_DISABLED: "true"}))
    assert (done.step, done.would_free_nodes, done.would_free_gpus) == (None, 0, 0)
    assert SCALE_DOWN_DISABLED in done.held_back


def test_a_pdb_allowing_no_disruption_moves_nothing() -> None:
    for allowed in (0, None):  # None: the disruption controller wrote no status yet
        done = round_of(view(allowed=allowed))
        assert (done.step, done.would_free_nodes) == (None, 0)
        assert "PodDisruptionBudget inference/chat allows 0" in done.held_back


def test_the_rate_limit_holds_a_node_back_until_its_moves_fit() -> None:
    recent = tuple(NOW - timedelta(minutes=m) for m in (5, 10, 20, 50))
    done = round_of(view(), recent=recent)
    assert done.step is None
    assert done.held_back.startswith("rate limit")
    old = tuple(NOW - timedelta(minutes=61 + m) for m in range(4))  # out of the hour
    assert round_of(view(), recent=old).step is not None


def test_no_node_is_started_in_quiet_hours_and_a_marked_one_is_given_up() -> None:
    quiet = ConsolidationSettings(mode="auto", quiet_hours=f"{NOW.hour}-{NOW.hour + 1}")
    assert round_of(view(), quiet).held_back == "quiet hours"
    given_up = round_of(view(marked="n1"), quiet, marked="n1")
    assert (given_up.unmark, given_up.done) == ("quiet hours began", False)


def test_a_marked_node_goes_on_then_its_mark_comes_off_once_it_is_empty() -> None:
    going = round_of(view(marked="n1"), marked="n1")
    assert going.step is not None
    assert going.step.pod_key == "inference/chat-0"
    assert going.mark == ""  # marked already
    moved = [chat("chat-1", "n2", "g2"), chat("chat-2", "n2", "g2")]
    empty = round_of(view(pods=moved, marked="n1"), marked="n1")
    assert (empty.unmark, empty.done) == ("node n1 holds no GPU pod any more", True)


def test_a_marked_node_whose_pods_cannot_all_go_any_more_is_given_up() -> None:
    pods = [
        chat("chat-0", "n1", "g1", **{"fracpilot.io/opt-out": "true"}),
        chat("chat-1", "n2", "g2"),
    ]
    done = round_of(view(pods=pods, marked="n1"), marked="n1")
    assert done.done is False
    assert "inference/chat-0 stays: opted out" in done.unmark


def test_a_marked_node_waits_while_an_evicted_pod_terminates() -> None:
    pods = [
        pod(
            "chat-0",
            node_name="n1",
            annotations={"gpu-fraction": "0.25"},
            labels={"runai-gpu-group": "g1", "app": "chat"},
            owner=("ReplicaSet", "chat-rs"),
            terminating=True,
        ),
        chat("chat-1", "n2", "g2"),
    ]
    done = round_of(view(pods=pods, marked="n1"), marked="n1")
    assert (done.step, done.unmark, done.held_back) == (None, "", "inference/chat-0 terminating")


def test_pdbs_select_pods_of_their_namespace_and_a_null_selector_none() -> None:
    inventory, _ = cluster()
    pods = inventory.pods.values()
    [one] = disruption_budgets([pdb(1)], pods)
    assert (one.name, one.allowed, one.pods) == (
        "inference/chat",
        1,
        frozenset({"inference/chat-0", "inference/chat-1"}),
    )
    [every] = disruption_budgets([pdb(2, selector={})], pods)
    assert every.pods == one.pods
    expression = {"matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}]}
    assert disruption_budgets([pdb(2, selector=expression)], pods)[0].pods == frozenset()
    null = pdb(2)
    null["spec"]["selector"] = None
    assert disruption_budgets([null], pods)[0].pods == frozenset()


def test_a_move_is_verified_by_its_bound_replacement_as_read_from_the_new_pod() -> None:
    step = round_of(view()).step
    assert step is not None
    inventory, _ = cluster(pods=[chat("chat-1", "n2", "g2")])
    move = MoveInFlight(
        step=step,
        namespace="inference",
        controller=("ReplicaSet", "chat-rs"),
        known_uids=frozenset({"uid-chat-0", "uid-chat-1"}),
        started_at=NOW,
    )
    assert move_verdict(move, inventory, NOW, 60).state == "waiting"
    assert move_verdict(move, inventory, NOW + timedelta(seconds=61), 60).state == "timed_out"
    landed, _ = cluster(pods=[chat("chat-1", "n2", "g2"), chat("chat-2", "n2", "g2")])
    verdict = move_verdict(move, landed, NOW, 60)
    assert (verdict.state, verdict.pod, verdict.node, verdict.gpu, verdict.fraction) == (
        "verified",
        "chat-2",
        "n2",
        UUID_B,
        0.25,
    )
    assert "as predicted" in verdict.reason


@pytest.mark.parametrize(
    ("hours", "quiet", "busy"),
    [
        ("22-6", [22, 23, 0, 5], [6, 12, 21]),
        ("0-6,20-24", [0, 5, 20, 23], [6, 19]),
        ("0-24", [0, 12, 23], []),
        ("", [], [0, 12]),
    ],
)
def test_quiet_hours(hours: str, quiet: list[int], busy: list[int]) -> None:
    settings = ConsolidationSettings(quiet_hours=hours)
    assert [settings.quiet_at(h) for h in quiet] == [True] * len(quiet)
    assert [settings.quiet_at(h) for h in busy] == [False] * len(busy)


def test_quiet_hours_that_are_not_hours_are_refused() -> None:
    with pytest.raises(ValueError, match="quiet hours"):
        ConsolidationSettings(quiet_hours="22-25")


# --- a single card: one node n1 with GPUs A and B, chat-0 on A, chat-1 on B ------------------


def one_node(pods: list[dict[str, Any]] | None = None, allowed: int = 1) -> ConsolidationView:
    nodes = {"n1": node("n1", gpus=2)}
    if pods is None:
        pods = [chat("chat-0", "n1", "g1"), chat("chat-1", "n1", "g2")]
    objects = [reservation("g1", UUID_A, "n1"), reservation("g2", UUID_B, "n1"), *pods]
    inventory = build_inventory(
        list(nodes.values()), objects, cluster="test", default_gpu_memory_mib=81920
    )
    return ConsolidationView(
        inventory=inventory,
        nodes=nodes,
        budgets=disruption_budgets([pdb(allowed)], inventory.pods.values()),
        namespace_labels=AUTO_NS,
    )


def card_round(v: ConsolidationView, card: str = "", **kw: Any) -> Any:
    settings = kw.pop("settings", AUTO)
    return consolidation_round(
        v,
        settings,
        OPT_IN,
        marked="",
        recent_moves=kw.pop("recent", ()),
        now=NOW,
        card=card,
        card_node=kw.pop("card_node", "n1" if card else ""),
    )


def test_with_no_node_to_empty_a_card_is_emptied_onto_the_fuller_card_without_a_taint() -> None:
    done = card_round(one_node())
    assert (done.would_free_gpus, done.would_free_nodes) == (1, 0)
    assert (done.card, done.node) == (UUID_A, "n1")
    assert "empties GPU GPU-a on node n1" in done.mark
    step = done.step
    assert step is not None
    assert (step.kind, step.pod_key, step.to_gpu, step.to_node) == (
        StepKind.MOVE,
        "inference/chat-0",
        UUID_B,
        "n1",
    )


def test_a_card_waits_for_the_rate_limit_and_for_its_evicted_tenant() -> None:
    held = card_round(one_node(), recent=(NOW - timedelta(minutes=5),) * 4)
    assert (held.card, held.step) == ("", None)
    assert "fewer than any card needs" in held.held_back
    going = chat("chat-0", "n1", "g1")
    going["metadata"]["deletionTimestamp"] = NOW.isoformat()
    waits = card_round(one_node([going, chat("chat-1", "n1", "g2")]), card=UUID_A)
    assert (waits.card, waits.unmark, waits.step) == (UUID_A, "", None)
    assert "terminating" in waits.held_back


def test_a_card_being_emptied_goes_on_then_is_done_once_empty() -> None:
    on = card_round(one_node(), card=UUID_A)
    assert (on.card, on.mark, on.unmark) == (UUID_A, "", "")
    assert on.step is not None
    assert on.step.pod_key == "inference/chat-0"
    empty = card_round(
        one_node([chat("chat-1", "n1", "g2"), chat("chat-2", "n1", "g2")]), card=UUID_A
    )
    assert (empty.card, empty.done) == (UUID_A, True)
    assert "holds no pod any more" in empty.unmark


def test_a_card_whose_tenants_can_no_longer_go_is_given_up_and_so_is_one_in_recommend() -> None:
    refused = card_round(one_node(allowed=0), card=UUID_A)
    assert (refused.card, refused.done) == (UUID_A, False)
    assert "PodDisruptionBudget" in refused.unmark
    recommend = card_round(one_node(), card=UUID_A, settings=ConsolidationSettings())
    assert (recommend.card, recommend.unmark) == (UUID_A, "consolidation is recommend")
    # KAI deletes an emptied card's reservation pod: its id leaves the inventory, its node stays
    gone = card_round(one_node(), card="n1/group/gone", card_node="n1")
    assert (gone.done, gone.unmark) == (True, "GPU n1/group/gone holds no pod any more")
    node_gone = card_round(one_node(), card="n9/group/g", card_node="n9")
    assert (node_gone.done, node_gone.unmark) == (False, "node n9 is not in the cluster")


def test_a_replacement_on_the_right_node_but_another_card_is_not_as_predicted() -> None:
    step = card_round(one_node()).step
    assert step is not None
    move = MoveInFlight(
        step=step,
        namespace="inference",
        controller=("ReplicaSet", "chat-rs"),
        known_uids=frozenset({"uid-chat-0", "uid-chat-1"}),
        started_at=NOW,
    )
    back = one_node([chat("chat-1", "n1", "g2"), chat("chat-2", "n1", "g1")])
    verdict = move_verdict(move, back.inventory, NOW, 60)
    assert (verdict.state, verdict.gpu, verdict.as_predicted) == ("verified", UUID_A, False)
    assert "GPU GPU-a, not GPU-b as predicted" in verdict.reason
    right = one_node([chat("chat-1", "n1", "g2"), chat("chat-2", "n1", "g2")])
    assert move_verdict(move, right.inventory, NOW, 60).as_predicted


def test_progress_is_saved_and_read_back_whole_and_checked_against_the_cluster() -> None:
    step = card_round(one_node()).step
    assert step is not None
    move = MoveInFlight(step, "inference", ("ReplicaSet", "chat-rs"), frozenset({"u1"}), NOW)
    saved = Progress(node="n1", card=UUID_A, move=move, workload="w", moves=(NOW,))
    assert progress_of(progress_json(saved)) == saved
    assert resume_refusal(saved, one_node()) is None
    assert resume_refusal(Progress(node="n1", card="n1/group/gone"), one_node()) is None
    assert "node n9 of GPU GPU-a is not in the cluster" in str(
        resume_refusal(Progress(node="n9", card=UUID_A), one_node())
    )
    assert "no longer carries the mark" in str(resume_refusal(Progress(node="n1"), one_node()))
    assert resume_refusal(Progress(node="n1"), view(marked="n1")) is None
    with pytest.raises(ValueError, match="unreadable"):
        progress_of('{"card": "x"}')


# --- shared isolation: room made on the target card by shrinking its tenant in place ---------


def big(name: str, fraction: str, group: str) -> dict[str, Any]:
    return pod(
        name,
        node_name="n1",
        annotations={"gpu-fraction": fraction},
        labels={"runai-gpu-group": group, "app": "big"},
        owner=("ReplicaSet", "big-rs"),
    )


BIG_FORECAST = {"inference/big-0": CardForecast(memory_peak=0.3, memory_jump=0.02, compute=0.3)}


def test_under_shared_isolation_the_target_tenant_shrinks_in_place_before_the_move() -> None:
    cramped = one_node([chat("chat-0", "n1", "g1"), big("big-0", "0.6", "g2")])
    plain = card_round(cramped)  # no forecast: GPU B has 0.4 free, chat-0 (0.25) fits anyway
    assert plain.step is not None
    assert plain.step.kind is StepKind.MOVE
    half = one_node([chat("chat-0", "n1", "g1"), big("big-0", "0.8", "g2")])
    assert card_round(half).card == ""  # 0.2 free on B: no room without a shrink
    shrink = consolidation_round(
        half, AUTO, OPT_IN, marked="", recent_moves=(), now=NOW, forecasts=BIG_FORECAST
    )
    assert shrink.card == UUID_A
    step = shrink.step
    assert step is not None
    assert (step.kind, step.pod_key, step.to_gpu) == (StepKind.SHRINK, "inference/big-0", UUID_B)
    assert 0.3 <= step.fraction <= 0.75  # its need at least, and room for chat-0's 0.25
    shrunk = one_node([chat("chat-0", "n1", "g1"), big("big-0", f"{step.fraction:g}", "g2")])
    then = consolidation_round(
        shrunk,
        AUTO,
        OPT_IN,
        marked="",
        recent_moves=(),
        now=NOW,
        card=UUID_A,
        card_node="n1",
        forecasts=BIG_FORECAST,
    )
    assert then.step is not None
    assert (then.step.kind, then.step.pod_key, then.step.to_gpu) == (
        StepKind.MOVE,
        "inference/chat-0",
        UUID_B,
    )


def test_a_tenant_that_is_not_opted_in_or_is_enforced_never_shrinks() -> None:
    half = one_node([chat("chat-0", "n1", "g1"), big("big-0", "0.8", "g2")])
    inventory = half.inventory
    assert shrinkable(half, BIG_FORECAST, {}, {}) != {}
    assert shrinkable(half, BIG_FORECAST, {}, {"inference/big-0": "recommend"}) == {}
    enforced = big("big-0", "0.8", "g2")
    enforced["spec"]["containers"][0]["env"] = [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "8g"}]
    limited = one_node([chat("chat-0", "n1", "g1"), enforced])
    assert shrinkable(limited, BIG_FORECAST, {}, {}) == {}
    assert inventory.pods["inference/big-0"].share is not None
