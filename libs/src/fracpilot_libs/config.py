"""Settings shared by every service; each service subclasses them with its own fields.

All settings come from the environment with the prefix ``FRACPILOT_`` (pydantic-settings).
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServiceSettings(BaseSettings):
    """What every service needs: where NATS is, how to be observed, how loud to log."""

    model_config = SettingsConfigDict(env_prefix="FRACPILOT_", extra="ignore")

    nats_url: str = Field(
        default="nats://127.0.0.1:4222", description="NATS server URL(s), comma-separated"
    )
    nats_user: str | None = None
    nats_password: str | None = None
    nats_creds_file: str | None = None
    nats_connect_timeout_s: float = 5.0
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(default=0, description="0 picks a free port; it is logged at start")
    otlp_endpoint: str | None = Field(
        default=None, description="OTLP/HTTP base URL; no export when unset"
    )
    log_level: str = "INFO"
    usage_max_age_s: float = Field(default=24 * 3600.0, description="retention of usage samples")
    fetch_batch: int = Field(default=64, ge=1, le=10_000)
    max_deliver: int = Field(
        default=5, ge=1, description="deliveries before a message is dead-lettered"
    )
