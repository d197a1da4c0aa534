"""``fracpilot status``, ``explain`` and ``report`` against a real nats-server holding a recorded
fleet (tests/support/operator_scenario.py): what they print matches what was published.

The commands run through typer's CliRunner in a worker thread (they run their own event loop);
``status --watch`` runs as a process.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from click.testing import Result
from typer.testing import CliRunner

from fracpilot_cli.main import app
from fracpilot_libs.contracts import ActuationResult, FractionDecision
from fracpilot_libs.nats import subjects
from helpers import reset_nats
from support.operator_scenario import (
    DEVICE,
    Recording,
    namespace_policy,
    operator_fleet,
    publish,
    record,
)

pytestmark = pytest.mark.integration
A100_PER_HOUR = 3.40
FRACPILOT = Path(sys.executable).parent / "fracpilot"


@pytest.fixture(params=["sample", "batch"])
async def recording(nats_url: str, request: pytest.FixtureRequest) -> Recording:
    """The recorded fleet, its usage in either of ingest's formats: every command reads both."""
    await reset_nats(nats_url)
    rec = record(operator_fleet(), namespace_policy("inference", 3))
    broken = {"test/inference/Deployment/broken": b"{oops"}
    await publish(nats_url, rec, extra_states=broken, wire=request.param)
    return rec


async def fracpilot(url: str, *args: str) -> Result:
    runner = CliRunner()
    return await asyncio.to_thread(
        runner.invoke, app, list(args), env={"FRACPILOT_NATS_URL": url, "COLUMNS": "250"}
    )


def items_by_name(output: str) -> dict[str, dict[str, Any]]:
    return {i["workload"]: i for i in json.loads(output)["items"]}


async def test_status_rows_match_what_was_published(nats_url: str, recording: Recording) -> None:
    result = await fracpilot(nats_url, "status", "-o", "json")
    assert result.exit_code == 0, result.output
    # The corrupt engine checkpoint is reported, not fatal.
    assert "1 entry did not decode" in result.stderr
    assert "engine state test/inference/Deployment/broken" in result.stderr
    document = json.loads(result.stdout)
    items = items_by_name(result.stdout)
    # Risk order: memory over, near, then the rest by usage share.
    assert [i["workload"] for i in document["items"]] == [
        "chat",
        "batch",
        "search",
        "translate",
        "embed",
    ]
    for name, item in items.items():
        samples, _, results = recording.of(name)
        key = subjects.kv_key(samples[0].workload)
        held = recording.allocations[key].fraction
        assert item["fraction"] == held, name
        assert item["gpu_memory_bytes"] == int(held * DEVICE), name
        assert item["last_sample_at"] == samples[-1].timestamp.isoformat(), name
        assert item["saved_usd_month"] == pytest.approx((1 - held) * A100_PER_HOUR * 730), name
        assert item["gpu_model"] == samples[-1].gpu_model
        if results:
            last = results[-1]
            assert (item["last_plan"], item["last_outcome"]) == (
                last.plan.value,
                last.outcome.value,
            ), name
            assert item["last_fraction_before"] == last.fraction_before
            assert item["last_fraction_after"] == last.fraction_after
            assert item["last_action_at"] == last.finished_at.isoformat()
            assert item["last_error"] == last.error
        else:
            assert item["last_plan"] == "", name
        if key in recording.states:
            assert item["samples"] == len(samples), name
            assert (item["policy_scope"], item["policy_revision"]) == ("namespace.inference", 3)
        else:
            assert item["state"] == "unknown"
            assert item["policy_scope"] == "cluster"

    chat = items["chat"]  # memory 0.3 on 0.25; its upsize to 0.5 failed
    assert chat["memory_of_fraction"] == pytest.approx(1.2)
    assert (chat["state"], chat["requested"], chat["target"]) == ("upsizing", 0.5, 0.5)
    assert chat["risk"] == "memory over"
    assert "refused" in chat["last_error"]
    embed = items["embed"]  # 0.1 of 0.5 for 40 minutes: 21 minutes of the hold left
    assert (embed["state"], embed["target"], embed["wait_s"]) == ("waiting to downsize", 0.25, 1260)
    assert embed["held_by"] == "downsize hold"
    assert (items["search"]["state"], items["search"]["target"]) == ("stable", 0.5)
    assert items["search"]["compute_of_fraction"] == pytest.approx(0.72)
    assert items["translate"]["memory_of_fraction"] == pytest.approx(0.6)
    assert items["batch"]["compute_of_fraction"] == pytest.approx(0.7 / 0.75)
    assert items["batch"]["risk"] == "near"
    assert document["totals"]["workloads"] == 5
    assert document["totals"]["gpus_held"] == pytest.approx(2.5)
    # Consolidation (auto): the latest plan, and what the moves since midnight freed.
    consolidation = document["consolidation"]
    assert consolidation["modes"] == ["auto"]
    assert (consolidation["would_free_gpus"], consolidation["would_free_nodes"]) == (1, 0)
    [planned] = consolidation["moves"]
    assert (planned["pod"], planned["to_gpu"], planned["frees_name"]) == (
        "inference/translate-0",
        "GPU-b-0",
        "GPU-b-1",
    )
    assert consolidation["today"] == {
        "started": 3,
        "verified": 2,
        "failed": 1,
        "abandoned": 1,
        "freed_nodes": 1,
        "freed_gpus": 2,
    }


async def test_status_table_yaml_and_namespace(nats_url: str, recording: Recording) -> None:
    table = await fracpilot(nats_url, "status")
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "NAMESPACE",
        "WORKLOAD",
        "FRACTION",
        "GPU-MEM",
        "COMPUTE-P95",
        "MEM-PEAK",
        "TARGET",
        "STATE",
        "LAST-ACTION",
        "SAVED/MONTH",
        "WOULD-SAVE",
    ]
    assert [line.split()[1] for line in lines[1:6]] == [
        "chat",
        "batch",
        "search",
        "translate",
        "embed",
    ]
    assert "upsizing (asked 0.5)" in lines[1]
    assert "recreate_elsewhere 0.25->0.25 failed" in lines[1]
    assert "120%" in lines[1]
    assert "waiting to downsize (21m)" in lines[5]
    assert "$1,241" in lines[5]
    # What applying the recommendations would add: the engine's targets against what is held.
    # chat's upsize to 0.5 would cost what embed's downsize to 0.25 would save.
    assert lines[1].split()[-1] == "-$620"
    assert lines[5].split()[-1] == "$620"
    assert lines[-3:] == [
        "5 workloads, 2.50 GPUs held, $6,205/month saved against whole GPUs, "
        "$0/month more with the targets applied",
        "consolidation: freed 2 GPUs / 1 node today (2 moves); "
        "would free 1 GPU / 0 nodes (1 move) more",
        "  move inference/translate-0 (0.5 GPU): node-b/GPU-b-1 -> node-b/GPU-b-0",
    ]
    assert "WOULD-SAVE" in lines[0]

    as_yaml = await fracpilot(nats_url, "status", "-o", "yaml", "-n", "jobs")
    assert as_yaml.exit_code == 0, as_yaml.output
    document = yaml.safe_load(as_yaml.stdout)
    assert [i["workload"] for i in document["items"]] == ["batch"]
    as_json = await fracpilot(nats_url, "status", "-o", "json", "--namespace", "jobs")
    assert json.loads(as_json.stdout)["items"] == document["items"]

    wide = await fracpilot(nats_url, "status", "-o", "wide")
    assert "namespace.inference@3" in wide.stdout
    assert "memory over" in wide.stdout

    bad = await fracpilot(nats_url, "status", "-o", "xml")
    assert bad.exit_code == 2
    assert "choose one of table, wide, json, yaml" in bad.stderr

    nc = await nats.connect(nats_url)
    try:  # the readers' consumers are gone once the commands are
        js = nc.jetstream()
        for stream in await js.streams_info():
            consumers = await js.consumers_info(stream.config.name)
            assert [c.name for c in consumers if c.name.startswith("fracpilot-cli-")] == []
    finally:
        await nc.close()


async def test_explain_shows_each_decision_and_what_was_done(
    nats_url: str, recording: Recording
) -> None:
    result = await fracpilot(nats_url, "explain", "inference/translate", "-o", "json")
    assert result.exit_code == 0, result.output
    timeline = json.loads(result.stdout)
    _, decisions, results = recording.of("translate")
    assert len(decisions) == 2
    entries = timeline["entries"]
    assert [e["decision_id"] for e in entries] == [d.decision_id for d in reversed(decisions)]
    for entry, published in zip(entries, reversed(decisions), strict=True):
        assert FractionDecision.model_validate(entry["decision"]) == published
        assert [ActuationResult.model_validate(a) for a in entry["actions"]] == [
            r for r in results if r.decision_id == published.decision_id
        ]
    assert [len(e["actions"]) for e in entries] == [2, 1]  # the scale-up reported twice
    assert timeline["status"]["fraction"] == 0.5
    assert timeline["workload"]["cluster"] == "test"

    text = await fracpilot(nats_url, "explain", "inference/translate")
    assert text.exit_code == 0, text.output
    out = text.stdout
    for d in decisions:
        assert d.explanation in out
        assert f"decision {d.decision_id}" in out
    assert out.index(decisions[1].decision_id) < out.index(decisions[0].decision_id)
    assert "policy revision 3" in out
    assert "did: scale_up, applied" in out
    assert "did: in_place, applied" in out
    assert "capacity appeared on node-b; evicted" in out

    chat = await fracpilot(nats_url, "explain", "inference/chat")
    assert "did: recreate_elsewhere, failed" in chat.stdout
    assert "error: eviction of inference/chat-0 refused 8 times (429); not forced" in chat.stdout

    quiet = await fracpilot(nats_url, "explain", "inference/search")
    assert quiet.exit_code == 0
    assert "No decisions recorded" in quiet.stdout
    assert "inference/search (Deployment, cluster test)" in quiet.stdout
    assert "target 0.5, stable" in quiet.stdout

    missing = await fracpilot(nats_url, "explain", "inference/nope")
    assert missing.exit_code == 1
    assert "nothing recorded about inference/nope" in missing.stderr
    usage = await fracpilot(nats_url, "explain", "just-a-name")
    assert usage.exit_code == 2


async def test_report_json_matches_what_was_published(
    nats_url: str, recording: Recording, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    result = await fracpilot(nats_url, "report", "--since", "1h", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == [str(out / "report.html"), str(out / "report.json")]
    report = json.loads((out / "report.json").read_text())
    fleet = report["fleet"]
    assert fleet["samples"] == len(recording.samples)
    assert fleet["decisions"] == len(recording.decisions)
    assert fleet["actions"] == len(recording.results)
    assert fleet["actions_by_plan"] == dict(Counter(r.plan.value for r in recording.results))
    assert fleet["actions_by_outcome"] == dict(Counter(r.outcome.value for r in recording.results))
    # One-minute samples: each stands for a minute at the fraction it reports.
    held = sum(s.allocated_fraction or 1.0 for s in recording.samples) / 60
    assert fleet["fraction_hours"] == round(held, 4)
    assert fleet["whole_gpu_hours"] == round(len(recording.samples) / 60, 4)
    assert fleet["cost_saved_usd"] == pytest.approx(
        (len(recording.samples) / 60 - held) * A100_PER_HOUR, abs=0.011
    )
    overruns = [s for s in recording.samples if s.memory_share > (s.allocated_fraction or 1)]
    assert fleet["memory_overrun_samples"] == len(overruns) == 31
    by_name = {w["workload"]: w for w in report["workloads"]}
    assert set(by_name) == {"chat", "embed", "search", "translate", "batch"}
    for name, w in by_name.items():
        samples, decisions, results = recording.of(name)
        assert w["samples"] == len(samples)
        assert w["decisions"] == len(decisions)
        assert [(a["decision_id"], a["plan"], a["outcome"]) for a in w["actions"]] == [
            (r.decision_id, r.plan.value, r.outcome.value) for r in results
        ]
        assert w["final_fraction"] == samples[-1].allocated_fraction
    translate = by_name["translate"]
    assert translate["fraction_hours"] == round((61 * 0.5 + 10 * 0.25 + 4 * 0.5) / 60, 4)
    assert [(c["from"], c["to"]) for c in translate["fraction_changes"]] == [
        (0.5, 0.25),
        (0.25, 0.5),
    ]
    # Consolidation over the window: every move and node freed, and the last plan.
    assert report["consolidation"] == {
        "started": 3,
        "verified": 2,
        "failed": 1,
        "abandoned": 1,
        "freed_nodes": 1,
        "freed_gpus": 2,
        "freed_node_names": ["node-a"],
        "modes": ["auto"],
        "would_free_gpus": 1,
        "would_free_nodes": 0,
        "would_move": 1,
        "reported_at": recording.consolidation[-1].reported_at.isoformat(),  # type: ignore[union-attr]
    }
    assert (
        "consolidation: freed 2 GPUs / 1 node with 2 moves verified (1 failed, 1 given up); "
        "last plan would free 1 GPU / 0 nodes (1 move)"
    ) in result.stderr
    page = (out / "report.html").read_text()
    assert "<h2>Consolidation</h2>" in page
    assert "for the autoscaler: node-a." in page
    assert page.count("data:image/png;base64,") == 1 + 5  # the fleet and every workload
    assert f"{fleet['fraction_hours']}" in page

    await asyncio.sleep(1.5)  # a window that ends before now and starts after the publishes
    empty = await fracpilot(nats_url, "report", "--since", "1s", "--out", str(tmp_path / "e"))
    assert empty.exit_code == 0, empty.output
    emptied = json.loads((tmp_path / "e" / "report.json").read_text())
    assert (emptied["workloads"], emptied["consolidation"]) == ([], None)
    bad = await fracpilot(nats_url, "report", "--since", "yesterday")
    assert bad.exit_code == 2
    assert "not a duration" in bad.stderr


async def test_the_commands_say_when_nats_is_not_there() -> None:
    for args in (("status",), ("explain", "a/b"), ("report", "--out", "/tmp/unused")):
        result = await fracpilot("nats://127.0.0.1:1", *args)
        assert result.exit_code == 1, args
        assert "cannot connect to NATS at nats://127.0.0.1:1" in result.stderr


async def test_status_watch_refreshes_until_interrupted(
    nats_url: str, recording: Recording
) -> None:
    env = {**os.environ, "FRACPILOT_NATS_URL": nats_url}
    proc = subprocess.Popen(  # noqa: ASYNC220 - read from a worker thread below
        [str(FRACPILOT), "status", "--watch", "-o", "json", "--interval", "0.3"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        first = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
        second = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
    finally:
        proc.send_signal(signal.SIGINT)
        code = await asyncio.to_thread(proc.wait, 30)
    documents = [json.loads(first), json.loads(second)]
    assert [len(d["items"]) for d in documents] == [5, 5]
    assert documents[0]["generated_at"] < documents[1]["generated_at"]
    assert code == 0  # interrupted: a clean exit


@pytest.mark.parametrize("output", ["json", "table"])
async def test_ctrl_c_while_connecting_ends_the_watch(output: str) -> None:
    """A server that accepts and never answers: the interrupt lands inside the NATS connect,
    where the client may turn it into a connection error. The watch must still end, cleanly."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    url = f"nats://127.0.0.1:{silent.getsockname()[1]}"
    env = {**os.environ, "FRACPILOT_NATS_URL": url}
    proc = subprocess.Popen(  # noqa: ASYNC220 - waited on from a worker thread below
        [str(FRACPILOT), "status", "--watch", "-o", output, "--interval", "0.3"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        accepted = await asyncio.wait_for(asyncio.to_thread(silent.accept), 60)
        await asyncio.sleep(0.5)  # inside the connect: it waits for the server's INFO
        proc.send_signal(signal.SIGINT)
        code = await asyncio.to_thread(proc.wait, 15)
        accepted[0].close()
    finally:
        if proc.poll() is None:
            proc.kill()
        silent.close()
    assert code == 0


async def test_on_an_empty_server_nothing_is_shown_and_nothing_created(
    nats_url: str, tmp_path: Path
) -> None:
    await reset_nats(nats_url)
    status = await fracpilot(nats_url, "status")
    assert status.exit_code == 0
    assert "No workloads" in status.stderr
    assert json.loads((await fracpilot(nats_url, "status", "-o", "json")).stdout)["items"] == []
    explain = await fracpilot(nats_url, "explain", "inference/chat")
    assert explain.exit_code == 1
    report = await fracpilot(nats_url, "report", "--out", str(tmp_path))
    assert report.exit_code == 0, report.output
    assert json.loads((tmp_path / "report.json").read_text())["fleet"]["samples"] == 0
    nc = await nats.connect(nats_url)
    try:  # read-only: no stream, bucket or consumer left behind
        assert [s.config.name for s in await nc.jetstream().streams_info()] == []
    finally:
        await nc.close()
