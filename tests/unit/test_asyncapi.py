"""docs/asyncapi.yaml is what the generator makes from the code today, and a valid AsyncAPI 3.0
document whose schemas accept the messages the services really send."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

from factories import decision, sample
from fracpilot_cli import asyncapi
from fracpilot_libs.contracts import (
    ActuationResult,
    Allocation,
    DeadLetter,
    Outcome,
    PlanKind,
    Policy,
    PolicyReply,
    PolicyScope,
    UsageBatchHeader,
    WorkloadRef,
    utcnow,
)
from fracpilot_libs.nats import subjects
from fracpilot_libs.nats.usage_batch import encode_samples

ROOT = Path(__file__).resolve().parents[2]
DOCUMENT = ROOT / "docs" / "asyncapi.yaml"
SCHEMAS = ROOT / "tests" / "support" / "schemas"
HINT = "docs/asyncapi.yaml is out of date: run `.venv/bin/fracpilot asyncapi` and commit it"


def document() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(DOCUMENT.read_text())
    return loaded


def test_the_committed_document_is_what_the_code_generates() -> None:
    assert DOCUMENT.read_text() == asyncapi.render(), HINT


def test_generation_is_deterministic() -> None:
    assert asyncapi.render() == asyncapi.render()


def test_the_document_is_valid_asyncapi_3() -> None:
    schema_path = SCHEMAS / "asyncapi-3.0.0.json"
    readme = (SCHEMAS / "README.md").read_text()
    assert hashlib.sha256(schema_path.read_bytes()).hexdigest() in readme
    schema = json.loads(schema_path.read_text())
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}"
        for e in jsonschema.Draft7Validator(schema).iter_errors(document())
    ]
    assert errors == []


def test_every_address_parameter_is_declared_and_every_declared_one_is_used() -> None:
    for name, channel in document()["channels"].items():
        used = set(re.findall(r"\{(\w+)\}", channel["address"] or ""))
        assert used == set(channel.get("parameters", {})), name


def test_addresses_are_the_subjects_the_services_use() -> None:
    channels = document()["channels"]
    ref = WorkloadRef(cluster="c", namespace="team-a", owner_name="chat.v2")  # dot: one token
    fill = {
        "namespace": subjects.token(ref.namespace),
        "workload": subjects.token(ref.owner_name),
        "slot": str(subjects.usage_slot(ref)),
    }
    for channel, made in (
        ("usage", subjects.usage_subject(ref)),
        ("decisions", subjects.decision_subject(ref)),
        ("actuations", subjects.actuation_subject(ref)),
    ):
        assert channels[channel]["address"].format(**fill) == made
    assert channels["deadLetters"]["address"].format(service="ingest") == (
        subjects.deadletter_subject("ingest")
    )
    for verb, subject in (
        ("Set", subjects.POLICY_SET),
        ("Get", subjects.POLICY_GET),
        ("List", subjects.POLICY_LIST),
    ):
        assert channels[f"policy{verb}"]["address"] == subject


def test_every_bucket_stream_and_prefix_of_subjects_py_is_documented() -> None:
    text = DOCUMENT.read_text()
    for name, value in vars(subjects).items():
        if name.isupper() and isinstance(value, str) and name.endswith(("_BUCKET", "_STREAM")):
            assert f"`{value}`" in text, name
        if name.endswith("_PREFIX") and value.startswith("fracpilot."):
            assert f"address: {value}." in text, name
    assert f"`{subjects.USAGE_STREAM_PREFIX}<partition>`" in text


def test_every_channel_has_a_sender_and_a_receiver() -> None:
    doc = document()
    for name in doc["channels"]:
        actions = {
            op["action"]
            for op in doc["operations"].values()
            if op["channel"]["$ref"] == f"#/channels/{name}"
        }
        if name == "policyReply":  # the reply of the request operations
            continue
        if name == "deadLetters":  # kept for people to inspect; no service reads them
            assert actions == {"send"}
            continue
        assert actions == {"send", "receive"}, name


def test_a_name_added_to_subjects_py_must_be_described(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subjects, "NEW_THING_BUCKET", "fracpilot_new", raising=False)
    with pytest.raises(ValueError, match="NEW_THING_BUCKET"):
        asyncapi.build()


def real_messages() -> list[BaseModel]:
    ref = WorkloadRef(cluster="demo", namespace="inference", owner_name="chat")
    now = utcnow()
    (batch,) = encode_samples([sample()], 16)
    return [
        sample(gpu_model="NVIDIA A100-SXM4-80GB"),
        UsageBatchHeader.model_validate_json(batch.text.split(b"\n")[0]),
        decision(),
        ActuationResult(
            decision_id="d-1",
            workload=ref,
            plan=PlanKind.IN_PLACE,
            outcome=Outcome.APPLIED,
            fraction_before=0.5,
            fraction_after=0.75,
            finished_at=now,
        ),
        DeadLetter(
            service="decision",
            subject="fracpilot.usage.v1.inference.chat",
            reason="not valid JSON",
            error_kind="decode",
            raw_payload="{oops",
            received_at=now,
        ),
        Policy(),
        PolicyScope(),
        PolicyReply(ok=True, policy=Policy()),
        Allocation(
            workload=ref,
            pod="chat-0",
            node="n",
            gpu_uuid="GPU-1",
            fraction=0.5,
            device_memory_bytes=80 * 1024**3,
            updated_at=now,
        ),
    ]


@pytest.mark.parametrize("message", real_messages(), ids=lambda m: type(m).__name__)
def test_the_payload_schemas_accept_real_messages_and_refuse_unknown_fields(
    message: BaseModel,
) -> None:
    components = document()["components"]
    name = type(message).__name__
    assert components["messages"][name]["payload"] == {"$ref": f"#/components/schemas/{name}"}
    schema = {"$ref": f"#/components/schemas/{name}", "components": components}
    validator = jsonschema.Draft202012Validator(schema)
    payload = json.loads(message.model_dump_json())
    assert list(validator.iter_errors(payload)) == []
    assert list(validator.iter_errors({**payload, "surprise": 1}))  # extra="forbid"
