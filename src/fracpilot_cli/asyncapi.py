"""``fracpilot asyncapi``: the AsyncAPI 3.0 document of fracpilot's messages (docs/asyncapi.yaml).

Generated, never edited by hand: the channels' addresses come from the names in
:mod:`fracpilot_libs.nats.subjects` (every subject prefix, stream, consumer and KV bucket there
must be described in :mod:`fracpilot_cli.asyncapi_catalogue`, or generation fails), the payload
schemas
from the pydantic wire models (``model_json_schema``), and who sends and who receives each
message from the catalogue's table of operations. tests/unit/test_asyncapi.py regenerates the
document and fails on any difference, so it cannot drift from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from fracpilot_cli.asyncapi_catalogue import (
    BUCKETS,
    CONSUMERS,
    MODELS,
    OTHER_NAMES,
    PARAMETERS,
    STREAMS,
    Channel,
    channels,
    check_names_described,
    described,
    operations,
    raw_message_name,
)
from fracpilot_libs.nats import subjects

DOCUMENT = Path("docs/asyncapi.yaml")


def _schemas() -> dict[str, Any]:
    _, top = models_json_schema(
        [(m, "validation") for m in MODELS], ref_template="#/components/schemas/{model}"
    )
    schemas: dict[str, Any] = dict(sorted(top["$defs"].items()))
    schemas["NatsHeaders"] = {
        "type": "object",
        "description": "Headers of every JetStream publish.",
        "properties": {
            "Nats-Msg-Id": {
                "type": "string",
                "description": "de-duplication id (the server drops a repeat within 2 minutes)",
            },
            "traceparent": {
                "type": "string",
                "description": "W3C trace context: one trace spans ingest, decision, actuator",
            },
        },
    }
    return schemas


def _summary(model: type[BaseModel]) -> str:
    doc = (model.__doc__ or "").strip()
    if not doc:
        return {"PolicyScope": "Where a policy applies: the cluster, a namespace or a workload."}[
            model.__name__
        ]
    return " ".join(doc.split("\n\n")[0].split())


def _messages(channel_map: dict[str, Channel]) -> dict[str, Any]:
    jetstream = {"usage", "decisions", "actuations", "deadLetters"}
    messages: dict[str, Any] = {}
    for model in MODELS:
        messages[model.__name__] = {
            "name": model.__name__,
            "title": model.__name__,
            "summary": _summary(model),
            "contentType": "application/json",
            "payload": {"$ref": f"#/components/schemas/{model.__name__}"},
        }
    for name in ("usage", "decisions", "actuations", "deadLetters"):
        for message in channel_map[name].messages:
            if name in jetstream:
                messages[message]["headers"] = {"$ref": "#/components/schemas/NatsHeaders"}
    messages["UsageBatch"] = {
        "name": "UsageBatch",
        "title": "UsageBatch",
        "summary": "Lines separated by a newline: a UsageBatchHeader, then one UsageSample "
        "each (fracpilot_libs.nats.usage_batch), zlib-deflated (batches stored before "
        "2026-12-05 are the text: a reader tells them apart by the first byte, 0x78 or {).",
        "contentType": "application/x-ndjson",
        "headers": {"$ref": "#/components/schemas/NatsHeaders"},
        "payload": {
            "type": "string",
            "description": "UsageBatchHeader JSON, then `samples` lines of UsageSample JSON",
        },
    }
    messages["AnyRequest"] = {
        "name": "AnyRequest",
        "title": "AnyRequest",
        "summary": "Any payload (ignored).",
        "payload": {},
    }
    for name, bucket in described(BUCKETS, "_BUCKET").items():
        if bucket.model is None:
            message = raw_message_name(name)
            messages[message] = {
                "name": message,
                "title": message,
                "summary": f"A value of the KV bucket `{getattr(subjects, name)}`.",
                "payload": {"type": "string", "description": bucket.value},
            }
    return messages


def build() -> dict[str, Any]:
    """The AsyncAPI document as plain data (deterministic: same code, same document)."""
    check_names_described()
    described(STREAMS, "_STREAM")
    channel_map = channels()
    doc_channels: dict[str, Any] = {}
    for name, ch in channel_map.items():
        entry: dict[str, Any] = {"address": ch.address, "description": ch.description}
        if ch.parameters:
            entry["parameters"] = {p: {"description": PARAMETERS[p]} for p in ch.parameters}
        entry["messages"] = {m: {"$ref": f"#/components/messages/{m}"} for m in ch.messages}
        entry.update(ch.extra)
        doc_channels[name] = entry
    doc_operations: dict[str, Any] = {}
    for op_id, op in operations().items():
        entry = {
            "action": op.action,
            "channel": {"$ref": f"#/channels/{op.channel}"},
            "summary": op.summary,
            "tags": [{"name": s} for s in op.services],
            "messages": [
                {"$ref": f"#/channels/{op.channel}/messages/{m}"}
                for m in channel_map[op.channel].messages
            ],
        }
        if op.reply:
            entry["reply"] = {"channel": {"$ref": f"#/channels/{op.reply}"}}
        doc_operations[op_id] = entry
    streams = "; ".join(
        [
            f"`{subjects.USAGE_STREAM_PREFIX}<partition>`: {OTHER_NAMES['USAGE_STREAM_PREFIX']}",
            *(f"`{getattr(subjects, n)}`: {d}" for n, d in STREAMS.items()),
        ]
    )
    consumers = "; ".join(f"`{getattr(subjects, n)}`: {d}" for n, d in CONSUMERS.items())
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "fracpilot messages",
            "version": "1.0.0",
            "description": (
                "Every message fracpilot's services exchange over NATS: JSON, one pydantic "
                "wire model each (frozen, unknown fields forbidden, `schema_version`). "
                "Generated by `fracpilot asyncapi` from fracpilot_libs.nats.subjects and "
                "fracpilot_libs.contracts; do not edit. Operations are tagged with the "
                "service that sends or receives. "
                f"JetStream streams: {streams}. Durable consumers: {consumers}."
            ),
            "license": {"name": "Apache-2.0"},
        },
        "defaultContentType": "application/json",
        "servers": {
            "nats": {
                "host": "nats:4222",
                "protocol": "nats",
                "description": "NATS with JetStream (FRACPILOT_NATS_URL).",
            }
        },
        "channels": doc_channels,
        "operations": doc_operations,
        "components": {"messages": _messages(channel_map), "schemas": _schemas()},
    }


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def render() -> str:
    body = yaml.dump(build(), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)
    return (
        "# Generated by `fracpilot asyncapi` (src/fracpilot_cli/asyncapi.py); do not edit.\n" + body
    )


def asyncapi_command(
    output: Annotated[Path, typer.Option(help="where the document goes; '-' prints it")] = DOCUMENT,
    check: Annotated[
        bool, typer.Option("--check", help="write nothing; exit 1 when the file is out of date")
    ] = False,
) -> None:
    """Write the AsyncAPI document of every subject, its payload schema, sender and receiver."""
    text = render()
    if str(output) == "-":
        sys.stdout.write(text)
        return
    if check:
        current = output.read_text() if output.exists() else ""
        if current != text:
            print(f"{output} is out of date: run `fracpilot asyncapi`", file=sys.stderr)
            raise typer.Exit(code=1)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    print(f"wrote {output}")
