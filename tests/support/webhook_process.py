"""The admission webhook server alone, as a process of its own, for the webhook fuzz test
(tests/integration/test_fuzz_webhook.py): its memory is measured from outside, and a crash
is a process that exits.

    python tests/support/webhook_process.py --port P --cert C --key K [limits]

It serves :class:`~fracpilot_actuator.webhook.WebhookServer` on 127.0.0.1 with one target
(Deployment ``chat`` in ``inference``: 0.375 of a GPU, KAI), so a well-formed review of that
workload's pod is patched, until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from fracpilot_actuator.webhook import WebhookServer
from fracpilot_libs.contracts import GpuSharing, WorkloadRef, WorkloadTarget
from fracpilot_libs.nats import subjects

CLUSTER = "fuzz"
CHAT = WorkloadRef(
    cluster=CLUSTER, namespace="inference", owner_kind="Deployment", owner_name="chat"
)


async def serve(args: argparse.Namespace) -> None:
    target = WorkloadTarget(
        workload=CHAT,
        fraction=0.375,
        memory_mib=0,
        backend=GpuSharing.KAI,
        decision_id="d-fuzz",
        updated_at=datetime.now(UTC),
    )
    server = WebhookServer(
        {subjects.kv_key(CHAT): target},
        CollectorRegistry(),
        cert_file=args.cert,
        key_file=args.key,
        cluster=CLUSTER,
        max_body_bytes=args.max_body_bytes,
        body_timeout_s=args.body_timeout_s,
        idle_timeout_s=args.idle_timeout_s,
        tls_reload_interval_s=0,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await server.start("127.0.0.1", args.port)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--max-body-bytes", type=int, default=64 * 1024)
    parser.add_argument("--body-timeout-s", type=float, default=2.0)
    parser.add_argument("--idle-timeout-s", type=float, default=3.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
