"""The policy sync's settings (a group of the actuator's: ``FRACPILOT_POLICYSYNC_*``)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class PolicySyncSettings(BaseModel):
    """``FRACPILOT_POLICYSYNC_*``: FractionPolicy objects -> the policy bucket (the leader
    actuator, backend=kubernetes)."""

    enabled: bool = Field(
        default=True,
        description="sync FractionPolicy / ClusterFractionPolicy objects into the policy "
        "bucket (needs the CRDs and the RBAC the chart installs)",
    )
    resync_s: float = Field(
        default=60.0,
        gt=0,
        description="a full pass at least this often, seconds (also notices NATS policies)",
    )
    timeout_s: float = Field(default=30.0, gt=0, description="how long one API call may take")
