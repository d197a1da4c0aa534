"""Settings of the ``fracpilot`` command: the services' shared ones (NATS, prices) and the
decision service's cluster-default policy, from the same ``FRACPILOT_`` environment, so the
CLI sees what the services see."""

from __future__ import annotations

from fracpilot_libs.config import ServiceSettings
from fracpilot_libs.sizing.policies import ClusterPolicySettings


class CliSettings(ServiceSettings, ClusterPolicySettings):
    """What the CLI reads from the environment."""
