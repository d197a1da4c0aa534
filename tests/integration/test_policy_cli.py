"""``fracpilot policy get/set/list`` against a real nats-server and a running decision service.

The commands run through typer's CliRunner in a worker thread (they run their own event loop)
while the decision service runs in this test's loop.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from fracpilot_cli.main import app
from fracpilot_decision.service import DecisionService, DecisionSettings
from fracpilot_libs.contracts import Policy, PolicyLevel, PolicyScope
from helpers import reset_nats, running

pytestmark = pytest.mark.integration


@pytest.fixture
async def service(nats_url: str) -> AsyncIterator[DecisionService]:
    await reset_nats(nats_url)
    async with running(DecisionService(DecisionSettings(nats={"url": nats_url}))) as svc:
        yield svc


async def fracpilot(url: str, *args: str, stdin: str | None = None) -> Result:
    runner = CliRunner()
    return await asyncio.to_thread(
        runner.invoke, app, list(args), input=stdin, env={"FRACPILOT_NATS_URL": url}
    )


async def test_policy_commands_set_get_and_list(
    nats_url: str, service: DecisionService, tmp_path: Path
) -> None:
    listed = await fracpilot(nats_url, "policy", "list")
    assert listed.exit_code == 0, listed.output
    assert json.loads(listed.stdout) == []

    namespace = Policy(
        scope=PolicyScope(level=PolicyLevel.NAMESPACE, namespace="inference"), max_fraction=0.5
    )
    path = tmp_path / "inference.json"
    path.write_bytes(namespace.to_json())
    stored = await fracpilot(nats_url, "policy", "set", str(path))
    assert stored.exit_code == 0, stored.output
    assert Policy.model_validate(json.loads(stored.stdout)) == namespace.model_copy(
        update={"revision": 1}
    )

    from_stdin = await fracpilot(
        nats_url, "policy", "set", "-", stdin=Policy(max_fraction=0.75).model_dump_json()
    )
    assert from_stdin.exit_code == 0, from_stdin.output
    assert json.loads(from_stdin.stdout)["max_fraction"] == 0.75

    workload = await fracpilot(
        nats_url, "policy", "get", "--namespace", "inference", "--workload", "chat"
    )
    assert workload.exit_code == 0, workload.output
    effective = Policy.model_validate(json.loads(workload.stdout))
    assert effective.scope.key == "namespace.inference"
    assert effective.max_fraction == 0.5
    cluster = await fracpilot(nats_url, "policy", "get")
    assert json.loads(cluster.stdout)["max_fraction"] == 0.75

    # What `get` prints, `set` takes back: a round trip bumps the revision.
    path.write_text(workload.stdout)
    again = await fracpilot(nats_url, "policy", "set", str(path))
    assert json.loads(again.stdout)["revision"] == 2

    listed = await fracpilot(nats_url, "policy", "list")
    assert [p["scope"]["level"] for p in json.loads(listed.stdout)] == ["cluster", "namespace"]


async def test_policy_set_refused_exits_1_with_the_reason(
    nats_url: str, service: DecisionService, tmp_path: Path
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"min_fraction": 0.75, "max_fraction": 0.5}))
    result = await fracpilot(nats_url, "policy", "set", str(path))
    assert result.exit_code == 1
    assert "min_fraction 0.75 is above max_fraction 0.5" in result.stderr
    assert result.stdout == ""

    missing = await fracpilot(nats_url, "policy", "set", str(tmp_path / "nope.json"))
    assert missing.exit_code == 1
    assert "cannot read" in missing.stderr

    usage = await fracpilot(nats_url, "policy", "get", "--workload", "chat")
    assert usage.exit_code == 2
    assert "--namespace" in usage.output


async def test_policy_commands_say_when_nothing_answers(nats_url: str) -> None:
    await reset_nats(nats_url)
    no_service = await fracpilot(nats_url, "policy", "list")
    assert no_service.exit_code == 1
    assert "no decision service answers" in no_service.stderr
    no_server = await fracpilot("nats://127.0.0.1:1", "policy", "get")
    assert no_server.exit_code == 1
    assert "cannot connect to NATS" in no_server.stderr
