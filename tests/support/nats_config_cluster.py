"""Three nats-server processes started from a Kubernetes-style ``nats.conf`` (issue 17).

The chart's rendered ConfigMap, or a file in the official NATS chart's shape
(``official_chart_nats.conf`` beside this module), is run as it is, adapted only for loopback:
the client, monitoring and route ports, the routes (pod DNS names become 127.0.0.1 and the
nodes' route ports), the JetStream store and the pid file. ``$POD_NAME`` (the server name)
and the other variables come from each process's environment, as in the pods.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

from fracpilot_libs.nats.embedded import nats_server_binary
from support.nats_cluster import ClusterNode, NatsCluster

OFFICIAL_CHART_CONF = Path(__file__).resolve().parent / "official_chart_nats.conf"


def loopback_config(conf: str, node: ClusterNode, routes: list[str]) -> str:
    """``conf`` with this node's loopback ports, paths and routes. Values are matched, not
    layout, so both the chart's ``key: value`` file and the official chart's JSON-shaped one
    are adapted: the ports 4222 (client), 8222 (monitoring) and 6222 (routes), the store
    ``/data``, the pid file under ``/var/run/nats`` and the ``routes`` list."""
    q = r'"?'  # a key, quoted (JSON shape) or not
    route_list = ", ".join(f'"{r}"' for r in routes)
    replacements = (
        (rf"(?s)({q}routes{q}\s*:\s*\[).*?\]", rf"\g<1>{route_list}]"),
        (
            rf"({q})port{q}(\s*):(\s*)6222(?!\d)",
            rf'\g<1>host\g<1>: "127.0.0.1", \g<1>port\g<1>: {node.route_port}',
        ),
        (
            rf"({q})port{q}(\s*):(\s*)4222(?!\d)",
            rf'\g<1>host\g<1>: "127.0.0.1", \g<1>port\g<1>: {node.port}',
        ),
        (rf"({q}http_port{q}\s*:\s*)8222(?!\d)", rf"\g<1>{node.monitor_port}"),
        (r'"?/data"?', f'"{node.store_dir / "jetstream"}"'),
        (r'"?/var/run/nats/nats\.pid"?', f'"{node.store_dir / "nats.pid"}"'),
    )
    out = conf
    for pattern, replacement in replacements:
        out, count = re.subn(pattern, replacement, out)
        if count != 1:
            raise ValueError(f"{pattern!r} matched {count} times in the configuration")
    return out


class ConfigFileNode(ClusterNode):
    """A node run as ``nats-server -c <file>`` from a Kubernetes-style configuration."""

    def __init__(
        self,
        name: str,
        store_dir: Path,
        conf: str,
        env: Mapping[str, str],
        files: Mapping[str, str],
    ) -> None:
        super().__init__(name, store_dir)
        self.conf = conf
        self.env = dict(env)
        self.files = dict(files)  # included by the configuration, written beside it
        self.conf_path = store_dir / "nats.conf"

    def command(self, routes: list[str]) -> list[str]:
        self.conf_path.write_text(loopback_config(self.conf, self, routes))
        for name, text in self.files.items():
            (self.store_dir / name).write_text(text)
        return [nats_server_binary(), "-c", str(self.conf_path)]

    def environment(self) -> dict[str, str]:
        return {**os.environ, **self.env, "POD_NAME": self.name}


class ConfigFileCluster(NatsCluster):
    """:class:`NatsCluster` whose nodes run ``conf`` (``$POD_NAME``: ``<prefix>-0`` ...)."""

    def __init__(
        self,
        conf: str,
        env: Mapping[str, str] | None = None,
        files: Mapping[str, str] | None = None,
        prefix: str = "nats",
        size: int = 3,
    ) -> None:
        # not NatsCluster.__init__: its nodes would take free ports for nothing
        self.base_dir = Path(tempfile.mkdtemp(prefix="fracpilot-nats-cluster-"))
        while True:  # free ports are picked one by one: the same one may come twice
            self.nodes = [
                ConfigFileNode(
                    f"{prefix}-{i}", self.base_dir / f"{prefix}-{i}", conf, env or {}, files or {}
                )
                for i in range(size)
            ]
            ports = [p for n in self.nodes for p in (n.port, n.route_port, n.monitor_port)]
            if len(set(ports)) == len(ports):
                break
