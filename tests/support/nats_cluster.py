"""Three real nats-server processes in one JetStream cluster on loopback (the issue 17 tests).

Each node has its own client, route and monitoring ports (free ones) and its own store; the
routes name all three nodes. :meth:`NatsCluster.start` returns once the JetStream meta leader
is elected and knows every other node as a current peer (before that, a replicated stream can
be refused "no suitable peers for placement"). One node can be killed (SIGKILL), restarted on
the same ports and store, or frozen (SIGSTOP, a partition that looks like a hung machine) and
thawed (SIGCONT).
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.nats.embedded import nats_server_binary
from fracpilot_libs.runtime import ServiceRuntime
from fracpilot_libs.server_process import ServerProcess, free_port, wait_until_ready
from helpers import NatsAccess, connect
from support.nats_auth import (
    EXAMPLE_DIR,
    TlsFiles,
    chart_tls_files,
    example_config,
    identity_passwords,
)

CLUSTER_NAME = "fracpilot"


class ClusterNode:
    """One nats-server of the cluster; ``kill()`` then ``start()`` keeps its ports and store."""

    def __init__(self, name: str, store_dir: Path) -> None:
        self.name = name
        self.store_dir = store_dir
        self.port, self.route_port, self.monitor_port = free_port(), free_port(), free_port()
        self.log_path = store_dir / "nats-server.log"
        self.server = ServerProcess(name, self.log_path)

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.server.proc

    @proc.setter
    def proc(self, proc: subprocess.Popen[bytes] | None) -> None:
        self.server.proc = proc  # a test that stopped the process itself forgets it here

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def route_url(self) -> str:
        return f"nats://127.0.0.1:{self.route_port}"

    def command(self, routes: list[str]) -> list[str]:
        """The nats-server command line for a node routed to ``routes``."""
        return [
            nats_server_binary(),
            "-js",
            "-n",
            self.name,
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-m",
            str(self.monitor_port),
            "-sd",
            str(self.store_dir),
            "--cluster_name",
            CLUSTER_NAME,
            "--cluster",
            self.route_url,
            "--routes",
            ",".join(r for r in routes if r != self.route_url),
        ]

    def environment(self) -> dict[str, str] | None:
        """The process's environment (None: this process's)."""
        return None

    def start(self, routes: list[str]) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.server.start(self.command(routes), env=self.environment())

    @property
    def running(self) -> bool:
        return self.server.running

    def jsz(self) -> dict[str, Any] | None:
        """The node's /jsz monitoring page (None while it does not answer)."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.monitor_port}/jsz", timeout=1
            ) as response:
                return dict(json.loads(response.read()))
        except OSError:
            return None

    def meta_leader(self) -> str | None:
        jsz = self.jsz()
        meta = (jsz or {}).get("meta_cluster") or {}
        leader = meta.get("leader")
        return str(leader) if leader else None

    def kill(self) -> None:
        self.server.stop(kill=True)

    def freeze(self) -> None:
        self.server.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.server.send_signal(signal.SIGCONT)


class NatsCluster:
    """Three JetStream nodes routed to one another; a context manager."""

    def __init__(self, size: int = 3) -> None:
        self.base_dir = Path(tempfile.mkdtemp(prefix="fracpilot-nats-cluster-"))
        self.nodes = [ClusterNode(f"n{i}", self.base_dir / f"n{i}") for i in range(size)]

    @property
    def routes(self) -> list[str]:
        return [n.route_url for n in self.nodes]

    @property
    def url(self) -> str:
        """Every node's client URL, comma-separated (as FRACPILOT_NATS_URL takes them)."""
        return ",".join(n.url for n in self.nodes)

    def node(self, name: str) -> ClusterNode:
        return next(n for n in self.nodes if n.name == name)

    def start(self, timeout_s: float = 30.0) -> NatsCluster:
        for n in self.nodes:
            n.start(self.routes)
        self.wait_for_meta_leader(timeout_s)
        wait_until_ready(
            self.peers_current,
            [n.server for n in self.nodes],
            timeout=timeout_s,
            what=f"every JetStream peer current (nodes in {self.base_dir})",
        )
        return self

    def peers_current(self) -> bool | None:
        """True once the meta leader knows every other node as a current peer, else None (what
        ``wait_until_ready`` waits on)."""
        for node in self.nodes:
            meta = (node.jsz() or {}).get("meta_cluster") or {}
            peers = meta.get("replicas")
            if meta.get("leader") == node.name and peers is not None:
                others = len(self.nodes) - 1
                if len(peers) == others and all(p.get("current") for p in peers):
                    return True
        return None

    def restart(self, node: ClusterNode, timeout_s: float = 30.0) -> None:
        """Start a killed node again on its ports and store; return once it has a meta leader."""
        node.start(self.routes)
        self.wait_for_meta_leader(timeout_s, nodes=[node])

    def meta_leader(self, nodes: list[ClusterNode] | None = None) -> str | None:
        """The meta leader every given running node (default: all running) agrees on."""
        seen = {n.meta_leader() for n in (nodes or self.nodes) if n.running}
        return seen.pop() if len(seen) == 1 else None

    def wait_for_meta_leader(
        self, timeout_s: float = 30.0, nodes: list[ClusterNode] | None = None
    ) -> str:
        started = [n.server for n in self.nodes if n.proc is not None]
        return wait_until_ready(
            lambda: self.meta_leader(nodes),
            started,
            timeout=timeout_s,
            what=f"a JetStream meta leader (nodes in {self.base_dir})",
        )

    def cleanup(self) -> None:
        for n in self.nodes:
            n.kill()
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


async def stream_info(url: NatsAccess, stream: str) -> dict[str, Any]:
    """``$JS.API.STREAM.INFO.<stream>`` as the server sends it (``cluster.leader``,
    ``cluster.replicas``, ``config.num_replicas``); ``url``: client URLs, comma-separated, or
    an identity's settings."""
    nc = await connect(url)
    try:
        reply = await nc.request(f"$JS.API.STREAM.INFO.{stream}", b"", timeout=5)
    finally:
        await nc.close()
    return dict(json.loads(reply.data))


async def stream_leader(url: NatsAccess, stream: str) -> str | None:
    """The name of the node leading ``stream`` (None while it has no leader)."""
    info = await stream_info(url, stream)
    leader = (info.get("cluster") or {}).get("leader")
    return str(leader) if leader else None


async def replicas_of(url: NatsAccess) -> dict[str, int]:
    """Every stream on the server (KV buckets as KV_<bucket>) and its replicas."""
    nc = await connect(url)
    try:
        infos = await nc.jetstream().streams_info()
    finally:
        await nc.close()
    return {str(i.config.name): i.config.num_replicas or 1 for i in infos}


class IdleService:
    """A service that only declares the streams: what readiness is about here is the bus."""

    def __init__(self, url: str) -> None:
        self.runtime = ServiceRuntime(
            "test", ServiceSettings(nats={"url": url}, decision_partitions=2)
        )

    async def start(self) -> None:
        return None


# --- the cluster secured as the chart's default is (issue 29) ----------------------------------

# A test-only identity beside the chart's: the chaos scenarios move stream leaders before a
# fault (a step-down with a preferred peer), which none of fracpilot's identities may do.
FAULT_INJECTOR = "fault-injector"
_FAULT_INJECTOR_PERMISSIONS = (
    '{ publish: { allow: ["$JS.API.STREAM.LEADER.STEPDOWN.>"] }, '
    'subscribe: { allow: ["_INBOX.>"] } }'
)


class SecuredClusterNode(ClusterNode):
    """A node run as ``nats-server -c <file>``: deploy/nats's identities and permissions (the
    chart's source), client TLS, and the cluster block the chart renders for a clustered
    built-in NATS (helm/fracpilot/templates/_nats.tpl: ``no_advertise``, routes over mutual
    TLS with ``verify: true``), on loopback ports."""

    def __init__(self, name: str, store_dir: Path, base_config: str, tls: TlsFiles) -> None:
        super().__init__(name, store_dir)
        self.base_config = base_config
        self.tls = tls
        self.conf_path = store_dir / "nats-server.conf"

    def command(self, routes: list[str]) -> list[str]:
        config = self.base_config
        for pattern, replacement in (
            (r"(?m)^port: 4222$", f'host: "127.0.0.1"\nport: {self.port}'),
            (r"(?m)^server_name: fracpilot-nats$", f"server_name: {self.name}"),
            (r"store_dir: /data/jetstream", f'store_dir: "{self.store_dir / "jetstream"}"'),
        ):
            config, count = re.subn(pattern, lambda _m, r=replacement: r, config, count=1)
            if count != 1:
                raise ValueError(f"the example config no longer contains {pattern!r}")
        others = ", ".join(f'"{r}"' for r in routes if r != self.route_url)
        config += (
            f'\nhttp: "127.0.0.1:{self.monitor_port}"\n'
            "cluster {\n"
            f"  name: {CLUSTER_NAME}\n"
            '  host: "127.0.0.1"\n'
            f"  port: {self.route_port}\n"
            "  no_advertise: true\n"
            f"  routes: [{others}]\n"
            "  tls {\n"
            f'    cert_file: "{self.tls.server_cert}"\n'
            f'    key_file: "{self.tls.server_key}"\n'
            f'    ca_file: "{self.tls.ca}"\n'
            "    verify: true\n"
            "    timeout: 2\n"
            "  }\n"
            "}\n"
        )
        self.store_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(EXAMPLE_DIR / "permissions.conf", self.store_dir / "permissions.conf")
        self.conf_path.write_text(config)
        return [nats_server_binary(), "-c", str(self.conf_path)]


class SecuredCluster(NatsCluster):
    """:class:`NatsCluster` with every identity authenticated and TLS on clients and routes,
    the certificate made as the chart's hook makes it (:func:`chart_tls_files`)."""

    def __init__(self, size: int = 3) -> None:
        self.base_dir = Path(tempfile.mkdtemp(prefix="fracpilot-nats-cluster-"))
        self.tls = chart_tls_files(self.base_dir / "tls")
        self.passwords = identity_passwords() | {FAULT_INJECTOR: secrets.token_hex(16)}
        injector = (
            f'      {{ user: {FAULT_INJECTOR}, password: "{self.passwords[FAULT_INJECTOR]}", '
            f"permissions: {_FAULT_INJECTOR_PERMISSIONS} }}"
        )
        base = example_config(
            {k: v for k, v in self.passwords.items() if k != FAULT_INJECTOR},
            self.tls,
            extra_users=(injector,),
        )
        while True:  # free ports are picked one by one: the same one may come twice
            self.nodes = [
                SecuredClusterNode(f"n{i}", self.base_dir / f"n{i}", base, self.tls)
                for i in range(size)
            ]
            ports = [p for n in self.nodes for p in (n.port, n.route_port, n.monitor_port)]
            if len(set(ports)) == len(ports):
                break

    def settings(self, name: str, url: str | None = None) -> ServiceSettings:
        """An identity's connection settings: every node (or ``url``), its password, the CA."""
        return ServiceSettings(nats=self.identity(name, url)["nats"])

    def identity(self, name: str, url: str | None = None) -> dict[str, dict[str, str]]:
        """``ServiceSettings`` keyword arguments (the ``nats`` group) for one identity."""
        return {
            "nats": {
                "url": url or self.url,
                "user": name,
                "password": self.passwords[name],
                "tls_ca_file": str(self.tls.ca),
            }
        }

    def env(self, name: str, url: str | None = None) -> dict[str, str]:
        """The same identity as FRACPILOT_NATS_* environment variables (for a process)."""
        return {
            f"FRACPILOT_NATS_{k.upper()}": v for k, v in self.identity(name, url)["nats"].items()
        }

    def violations(self, user: str) -> list[str]:
        """Every node's log lines about permissions this user lacked."""
        who = f'"FRACPILOT/user:{user}"'
        return [
            line
            for n in self.nodes
            if n.log_path.exists()
            for line in n.log_path.read_text(errors="replace").splitlines()
            if who in line and "Violation" in line
        ]
