"""NATS access control with the example configuration in deploy/nats/, on a real nats-server.

The services run under their own identities through a whole pipeline (sample -> decision ->
actuation result, each dead-letter path, a policy change) with no permission violation in the
server's log, so the lists are sufficient; and identities without a right are refused by the
server: only ingest publishes samples, only decision publishes decisions and serves the policy
subjects, only policy-admin changes a policy, the operator reads. TLS (server-verified and
mutual) and nkey identities connect; an untrusted certificate or a refused identity fails at
once with the reason.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TypeVar

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.api import DeliverPolicy
from prometheus_client import CollectorRegistry
from pydantic import BaseModel
from typer.testing import CliRunner

from factories import decision, sample
from fracpilot_actuator.app import ActuatorService
from fracpilot_actuator.settings import ActuatorSettings
from fracpilot_cli.main import app
from fracpilot_decision.service import DecisionService
from fracpilot_decision.settings import DecisionSettings
from fracpilot_ingest.service import IngestService
from fracpilot_ingest.settings import IngestSettings
from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.contracts import (
    ActuationResult,
    ConsolidationMode,
    ConsolidationReport,
    DeadLetter,
    FractionDecision,
    Policy,
    PolicyReply,
    UsageSample,
    utcnow,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.bus import Bus
from fracpilot_libs.nats.connect import NatsSecurityError, open_connection
from fracpilot_libs.nats.decoding import decode
from fracpilot_libs.nats.usage_batch import batch_text, decode_batch
from helpers import running, usage_stream_of, wait_for
from support.fuzzing import decodes
from support.nats_auth import SecuredNats, TlsFiles, make_tls_files, make_user_nkey

pytestmark = pytest.mark.integration
M = TypeVar("M", bound=BaseModel)

SERVICES = ("ingest", "decision", "actuator")
NOT_ADMINS = ("ingest", "decision", "actuator", "operator")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredNats]:
    with SecuredNats(tmp_path_factory.mktemp("nats-auth")) as server:
        yield server


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("tls"))


class Connection:
    """A client connected as one identity, remembering the errors the server sent it."""

    def __init__(self, nc: NatsClient, errors: list[Exception]) -> None:
        self.nc = nc
        self.errors = errors

    def denied(self, subject: str) -> bool:
        return any(
            # nats-py lower-cases the server's message
            "permissions violation" in str(e).lower() and f'"{subject.lower()}"' in str(e).lower()
            for e in self.errors
        )


async def connect_as(server: SecuredNats, name: str) -> Connection:
    errors: list[Exception] = []

    async def remember(exc: Exception) -> None:
        errors.append(exc)

    settings = ServiceSettings(**server.identity(name))
    nc = await open_connection(settings, servers=server.url, error_cb=remember)
    return Connection(nc, errors)


@pytest.fixture
async def operator(secured: SecuredNats) -> AsyncIterator[Connection]:
    conn = await connect_as(secured, "operator")
    yield conn
    await conn.nc.close()


async def read_all(
    conn: Connection, subject: str, timeout: float = 3.0, stream: str | None = None
) -> list[bytes]:
    """Every message of a stream subject, read with an ordered (ephemeral) consumer."""
    js = conn.nc.jetstream()
    sub = await js.subscribe(
        subject, stream=stream, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
    )
    out: list[bytes] = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=timeout)
            except (nats.errors.TimeoutError, TimeoutError):
                return out
            out.append(msg.data)
            if msg.metadata.num_pending == 0:
                return out
    finally:
        await sub.unsubscribe()


async def policy_request(conn: Connection, subject: str, body: bytes) -> PolicyReply | None:
    """The reply, or None when there is none (the server dropped a refused publish)."""
    try:
        msg = await conn.nc.request(subject, body, timeout=1.5)
    except (nats.errors.TimeoutError, TimeoutError):
        return None
    return PolicyReply.model_validate_json(msg.data)


async def cli(env: dict[str, str], *args: str, stdin: str | None = None) -> tuple[int, str]:
    runner = CliRunner()
    result = await asyncio.to_thread(runner.invoke, app, list(args), input=stdin, env=env)
    return result.exit_code, result.output


def valid(model: type[M], payloads: list[bytes]) -> list[M]:
    return [decode(model, p) for p in payloads if decodes(model, p)]


def actions(actuator: ActuatorService) -> float:
    return sum(
        sample.value
        for metric in actuator.runtime.registry.collect()
        for sample in metric.samples
        if sample.name == "fracpilot_actuator_actions_total"
    )


# --- the permissions are enough --------------------------------------------------------------


async def test_services_run_the_pipeline_under_their_own_identities(
    secured: SecuredNats, operator: Connection
) -> None:
    actuator = ActuatorService(
        ActuatorSettings(
            **secured.identity("actuator"),
            sim={"pods": "inference/chat-llama-8b=0.5,inference/embed-bge=0.5", "cluster": "demo"},
        )
    )
    decision_svc = DecisionService(DecisionSettings(**secured.identity("decision")))
    ingest = IngestService(
        IngestSettings(
            **secured.identity("ingest"),
            sim={"workloads": 2, "duration_s": 4 * 3600, "speed": 3600},
        )
    )
    async with running(actuator), running(decision_svc), running(ingest):
        await wait_for(ingest.finished.is_set, timeout=30)
        await wait_for(lambda: actions(actuator) > 0, timeout=20)
        # Each service's dead-letter path, fed by the identity allowed to write there.
        as_ingest = await connect_as(secured, "ingest")
        await as_ingest.nc.jetstream().publish(
            subjects.usage_subject(sample().workload), b"not json", timeout=5
        )
        as_decision = await connect_as(secured, "decision")
        await as_decision.nc.jetstream().publish(
            subjects.decision_subject(decision().workload), b'{"new_fraction": 7}', timeout=5
        )
        as_actuator = await connect_as(secured, "actuator")
        kv = await as_actuator.nc.jetstream().key_value(subjects.ALLOCATION_BUCKET)
        await kv.put("demo/inference/Deployment/broken", b'{"fraction": "lots"}')
        # Consolidation's event stream: the actuator publishes, the operator reads.
        report = ConsolidationReport(
            cluster="demo",
            mode=ConsolidationMode.RECOMMEND,
            would_free_gpus=2,
            would_free_nodes=1,
            reported_at=utcnow(),
        )
        await as_actuator.nc.jetstream().publish(
            subjects.consolidation_report_subject("demo"), report.to_json(), timeout=5
        )
        # A policy change by policy-admin, while decision is running.
        admin = await connect_as(secured, "policy-admin")
        reply = await policy_request(
            admin, subjects.POLICY_SET, Policy(max_fraction=0.75).to_json()
        )
        assert reply is not None
        assert reply.ok, reply.error
        for conn in (as_ingest, as_decision, as_actuator, admin):
            await conn.nc.close()
        letters: list[DeadLetter] = []

        async def three_letters() -> bool:
            letters[:] = [
                DeadLetter.model_validate_json(d)
                for d in await read_all(operator, f"{subjects.DEADLETTER_PREFIX}.>", timeout=1)
            ]
            return {d.service for d in letters} >= set(SERVICES)

        for _ in range(40):
            if await three_letters():
                break
            await asyncio.sleep(0.25)
        assert {d.service for d in letters} == set(SERVICES), letters

    # (the junk published above for the dead-letter paths is left out)
    def samples_in(data: bytes) -> list[bytes]:  # a usage batch (deflated), or one sample
        if batch_text(data).startswith(b'{"batch_format"'):
            return decode_batch(data).lines
        return [data]

    usage = [
        data
        for p in range(16)  # the default partition count, which the permissions name
        for data in await read_all(
            operator, f"{subjects.USAGE_PREFIX}.>", stream=subjects.usage_stream(p)
        )
    ]
    samples = valid(UsageSample, [one for data in usage for one in samples_in(data)])
    decisions = valid(FractionDecision, await read_all(operator, f"{subjects.DECISION_PREFIX}.>"))
    results = valid(ActuationResult, await read_all(operator, f"{subjects.ACTUATION_PREFIX}.>"))
    reports = valid(ConsolidationReport, await read_all(operator, subjects.CONSOLIDATION_REPORTS))
    # the actuator service's own (its simulated cluster's plan) and the one published above
    assert {r.cluster for r in reports} == {"demo"}
    assert len(reports) >= 2
    assert 2 in {r.would_free_gpus for r in reports}
    assert len([s for s in samples if s.source == "simulator"]) == 2 * 4 * 60
    assert decisions, "the decision service published no decision"
    assert results, "the actuator published no result"
    sample_ids = {s.sample_id for s in samples}
    decision_ids = {d.decision_id for d in decisions}
    assert {d.trigger_sample_id for d in decisions} <= sample_ids
    assert {r.decision_id for r in results} <= decision_ids
    for name in (*SERVICES, "operator", "policy-admin"):
        assert secured.violations(name) == [], f"{name} lacked a permission"


# --- and nothing more ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "subject"),
    [
        ("ingest", "fracpilot.decision.v1.inference.chat"),
        ("actuator", "fracpilot.decision.v1.inference.chat"),
        ("operator", "fracpilot.decision.v1.inference.chat"),
        ("policy-admin", "fracpilot.decision.v1.inference.chat"),
        ("decision", "fracpilot.usage.v1.inference.chat"),
        ("actuator", "fracpilot.usage.v1.inference.chat"),
        ("decision", "fracpilot.actuation.v1.inference.chat"),
        ("ingest", "fracpilot.actuation.v1.inference.chat"),
        ("ingest", "fracpilot.deadletter.v1.decision"),  # no forging another's dead letters
        ("operator", "fracpilot.deadletter.v1.operator"),
        ("policy-admin", "$KV.fracpilot_policies.cluster"),  # set goes through validation
        ("actuator", "$KV.fracpilot_policies.cluster"),
        ("ingest", "$KV.fracpilot_allocations.demo/inference/Deployment/chat"),
        (
            "operator",
            f"$JS.API.CONSUMER.MSG.NEXT.FRACPILOT_USAGE_0.{subjects.decision_consumer(0)}",
        ),
        ("ingest", f"$JS.API.CONSUMER.MSG.NEXT.FRACPILOT_USAGE_0.{subjects.decision_consumer(0)}"),
        ("actuator", f"$JS.API.CONSUMER.DELETE.FRACPILOT_USAGE_0.{subjects.decision_consumer(0)}"),
        ("operator", "$JS.API.STREAM.DELETE.FRACPILOT_USAGE_3"),
        ("ingest", "$JS.API.STREAM.PURGE.FRACPILOT_USAGE_3"),
        ("operator", "$JS.API.STREAM.PURGE.FRACPILOT_DECISIONS"),
        ("ingest", "$JS.API.STREAM.DELETE.FRACPILOT_DECISIONS"),
        ("decision", "$JS.API.CONSUMER.DELETE.FRACPILOT_DECISIONS.actuator"),
        ("ingest", "fracpilot.consolidation.v1.report.demo"),  # only the actuator reports
        ("decision", "fracpilot.consolidation.v1.move.demo"),
        ("operator", "fracpilot.consolidation.v1.move.demo"),
        ("operator", "$JS.API.STREAM.PURGE.FRACPILOT_CONSOLIDATION"),
    ],
)
async def test_an_identity_cannot_publish_what_it_does_not_own(
    secured: SecuredNats, operator: Connection, name: str, subject: str
) -> None:
    if subject.startswith("fracpilot.decision"):
        # The stream a forged decision would land in, as the decision service declares it.
        owner = Bus(
            "decision", ServiceSettings(**secured.identity("decision")), CollectorRegistry()
        )
        await owner.connect()
        try:
            await owner.ensure_streams()
        finally:
            await owner.close()
    conn = await connect_as(secured, name)
    forged = decision(decision_id=f"forged-by-{name}").to_json()
    try:
        await conn.nc.publish(subject, forged, reply=conn.nc.new_inbox())
        await conn.nc.flush()
        await wait_for(lambda: conn.denied(subject), timeout=5)
    finally:
        await conn.nc.close()
    if subject.startswith("fracpilot.decision"):
        stored = await read_all(operator, f"{subjects.DECISION_PREFIX}.>", timeout=0.5)
        assert not [d for d in stored if b"forged-by" in d]


@pytest.mark.parametrize("name", ["ingest", "actuator", "operator", "policy-admin"])
async def test_only_decision_may_serve_the_policy_subjects(secured: SecuredNats, name: str) -> None:
    """Else an identity could answer set requests in the decision service's place."""
    conn = await connect_as(secured, name)
    try:
        await conn.nc.subscribe(subjects.POLICY_SET, queue=subjects.POLICY_QUEUE)
        await conn.nc.flush()
        await wait_for(lambda: conn.denied(subjects.POLICY_SET), timeout=5)
    finally:
        await conn.nc.close()


async def test_only_policy_admin_changes_a_policy(secured: SecuredNats) -> None:
    async with running(DecisionService(DecisionSettings(**secured.identity("decision")))):
        wanted = Policy(max_fraction=0.5, min_history_s=60.0)
        for name in NOT_ADMINS:
            conn = await connect_as(secured, name)
            try:
                assert await policy_request(conn, subjects.POLICY_SET, wanted.to_json()) is None
                await wait_for(lambda c=conn: c.denied(subjects.POLICY_SET), timeout=5)
            finally:
                await conn.nc.close()
        operator = await connect_as(secured, "operator")
        before = await policy_request(operator, subjects.POLICY_GET, b"")
        assert before is not None
        assert before.ok
        assert before.policy is not None
        assert before.policy.max_fraction != 0.5  # no refused set went through

        # The CLI reads the same FRACPILOT_NATS_* settings: refused for decision, with the reason.
        code, output = await cli(
            secured.env("decision"), "policy", "set", "-", stdin=wanted.model_dump_json()
        )
        assert code == 1
        assert "not allowed" in output
        assert "fracpilot.policy.v1.set" in output
        code, output = await cli(
            secured.env("policy-admin"), "policy", "set", "-", stdin=wanted.model_dump_json()
        )
        assert code == 0, output
        stored = Policy.model_validate(json.loads(output))
        assert stored.max_fraction == 0.5
        assert stored.revision == before.policy.revision + 1
        after = await policy_request(operator, subjects.POLICY_GET, b"")
        assert after is not None
        assert after.policy == stored
        code, output = await cli(secured.env("operator"), "policy", "list")
        assert code == 0, output
        assert [Policy.model_validate(p) for p in json.loads(output)] == [stored]
        await operator.nc.close()
    # This decision service started over the first test's state (checkpoints, partitions).
    assert secured.violations("decision", client="fracpilot-decision") == []


async def test_a_refused_identity_fails_at_once_with_the_reason(secured: SecuredNats) -> None:
    settings = ServiceSettings(
        nats={"url": secured.url, "user": "decision", "password": "not-the-password"}
    )
    bus = Bus("decision", settings, CollectorRegistry())
    with pytest.raises(NatsSecurityError, match="refused this identity"):
        await asyncio.wait_for(bus.connect(), timeout=15)  # not retried for a minute


async def test_an_nkey_identity_gets_the_permissions_it_is_bound_to(tmp_path: Path) -> None:
    seed = tmp_path / "ingest.nk"
    public = make_user_nkey(seed)
    user = f"      {{ nkey: {public}, permissions: $INGEST_PERMISSIONS }}"
    with SecuredNats(tmp_path / "nats", extra_users=(user,)) as server:
        errors: list[Exception] = []

        async def remember(exc: Exception) -> None:
            errors.append(exc)

        settings = ServiceSettings(nats={"url": server.url, "nkey_seed_file": str(seed)})
        nc = await open_connection(settings, servers=server.url, error_cb=remember)
        try:
            js = nc.jetstream()
            await js.add_stream(
                name=usage_stream_of(sample().workload), subjects=[f"{subjects.USAGE_PREFIX}.>"]
            )
            ack = await js.publish(subjects.usage_subject(sample().workload), sample().to_json())
            assert ack.seq == 1
            with pytest.raises((nats.errors.TimeoutError, TimeoutError)):
                await nc.request(subjects.POLICY_SET, b"{}", timeout=1)
            await wait_for(
                lambda: any("fracpilot.policy.v1.set" in str(e) for e in errors), timeout=5
            )
        finally:
            await nc.close()
        assert "authentication error" not in server.log_text


# --- TLS ---------------------------------------------------------------------------------------


async def test_tls_connects_with_the_ca_and_fails_clearly_without(
    tmp_path: Path, tls_files: TlsFiles
) -> None:
    with SecuredNats(tmp_path / "nats", tls=tls_files) as server:
        with_ca = DecisionSettings(**server.identity("decision"))
        assert with_ca.nats.tls_ca_file == str(tls_files.ca)
        async with running(DecisionService(with_ca)) as svc:
            assert svc.runtime.bus.connected
            code, output = await cli(server.env("operator"), "policy", "get")
            assert code == 0, output
            assert Policy.model_validate(json.loads(output)).revision == 0

            without = {k: v for k, v in server.env("operator").items() if "TLS" not in k}
            code, output = await cli(without, "policy", "get")
            assert code == 1
            assert "not trusted" in output
            assert "FRACPILOT_NATS_TLS_CA_FILE" in output

        no_ca = DecisionSettings(
            nats={
                k: v for k, v in server.identity("decision")["nats"].items() if k != "tls_ca_file"
            }
        )
        with pytest.raises(NatsSecurityError, match=r"not trusted.*FRACPILOT_NATS_TLS_CA_FILE"):
            async with running(DecisionService(no_ca)):
                pass

        other_ca = make_tls_files(tmp_path / "other").ca
        wrong = DecisionSettings(
            **{
                **with_ca.model_dump(),
                "nats": {**with_ca.nats.model_dump(), "tls_ca_file": str(other_ca)},
            }
        )
        with pytest.raises(NatsSecurityError, match="does not verify against"):
            async with running(DecisionService(wrong)):
                pass


async def test_mutual_tls_needs_the_client_certificate(tmp_path: Path, tls_files: TlsFiles) -> None:
    with SecuredNats(tmp_path / "nats", tls=tls_files, verify_clients=True) as server:
        server_only = DecisionSettings(**server.identity("decision"))
        with pytest.raises(NatsSecurityError):
            async with running(DecisionService(server_only)):
                pass
        client_pair = {
            "tls_cert_file": str(tls_files.client_cert),
            "tls_key_file": str(tls_files.client_key),
        }
        mutual = DecisionSettings(**server.identity("decision", **client_pair))
        async with running(DecisionService(mutual)) as svc:
            assert svc.runtime.bus.connected
            reader = ServiceSettings(**server.identity("operator", **client_pair))
            nc = await open_connection(reader, servers=server.url)
            reply = await nc.request(subjects.POLICY_LIST, b"", timeout=5)
            await nc.close()
            assert PolicyReply.model_validate_json(reply.data).ok


async def test_tls_settings_refuse_a_plain_text_server(tmp_path: Path, tls_files: TlsFiles) -> None:
    with SecuredNats(tmp_path / "nats") as server:
        settings = ServiceSettings(**server.identity("decision", tls_ca_file=str(tls_files.ca)))
        with pytest.raises(NatsSecurityError, match="does not offer it"):
            await open_connection(settings, servers=server.url)
