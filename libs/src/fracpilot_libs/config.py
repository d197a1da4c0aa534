"""Settings shared by every service; each service subclasses them with its own fields.

All settings come from the environment with the prefix ``FRACPILOT_`` (pydantic-settings).
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from fracpilot_libs.pricing import GpuPrices, UsdPerHour


class NatsSettings(BaseModel):
    """``FRACPILOT_NATS_*``: where NATS is and who this process is to it."""

    url: str = Field(
        default="nats://127.0.0.1:4222", description="NATS server URL(s), comma-separated"
    )
    user: str | None = Field(default=None, description="user name (with nats_password)")
    password: str | None = None
    creds_file: str | None = Field(
        default=None, description="a .creds file (user JWT and nkey seed, NATS operator mode)"
    )
    nkey_seed_file: str | None = Field(
        default=None, description="a file holding a user's nkey seed (SU...)"
    )
    tls_ca_file: str | None = Field(
        default=None, description="PEM CA that signed the server's certificate: TLS"
    )
    tls_cert_file: str | None = Field(
        default=None, description="PEM client certificate (with nats_tls_key_file): mutual TLS"
    )
    tls_key_file: str | None = None
    connect_timeout_s: float = 5.0
    replicas: int | None = Field(
        default=None,
        ge=1,
        le=5,
        description="replicas of every stream and KV bucket; unset: 3 when the server is "
        "clustered, 1 on a single server",
    )


class StreamLimitSettings(BaseModel):
    """``FRACPILOT_STREAMS_*``: size and age limits of the streams, per stream (0: none; a usage
    partition's age is ``FRACPILOT_USAGE_MAX_AGE_S``). A stream at its limit drops its oldest
    messages to take new ones (discard policy "old"), so publishers never fail on it."""

    usage_max_bytes: int = Field(default=0, ge=0, description="bytes per usage partition stream")
    decisions_max_bytes: int = Field(default=0, ge=0, description="FRACPILOT_DECISIONS bytes")
    decisions_max_age_s: float = Field(default=0.0, ge=0, description="FRACPILOT_DECISIONS age")
    results_max_bytes: int = Field(default=0, ge=0, description="FRACPILOT_ACTUATIONS bytes")
    results_max_age_s: float = Field(default=0.0, ge=0, description="FRACPILOT_ACTUATIONS age")
    deadletters_max_bytes: int = Field(default=0, ge=0, description="FRACPILOT_DEADLETTERS bytes")
    deadletters_max_age_s: float = Field(default=0.0, ge=0, description="FRACPILOT_DEADLETTERS age")


class MetricsEndpointSettings(BaseModel):
    """``FRACPILOT_METRICS_*``: where /metrics, /healthz and /readyz are served."""

    host: str = "127.0.0.1"
    port: int = Field(default=0, description="0 picks a free port; it is logged at start")


class ServiceSettings(BaseSettings):
    """What every service needs: where NATS is, how to be observed, how loud to log."""

    # Groups of settings are nested models whose environment names stay flat:
    # FRACPILOT_<GROUP>_<FIELD> (the group's name has no underscore; split once).
    model_config = SettingsConfigDict(
        env_prefix="FRACPILOT_",
        extra="ignore",
        env_nested_delimiter="_",
        env_nested_max_split=1,
    )

    nats: NatsSettings = Field(default_factory=lambda: NatsSettings())
    metrics: MetricsEndpointSettings = Field(default_factory=lambda: MetricsEndpointSettings())
    streams: StreamLimitSettings = Field(default_factory=lambda: StreamLimitSettings())
    otlp_endpoint: str | None = Field(
        default=None, description="OTLP/HTTP base URL; no export when unset"
    )
    log_level: str = "INFO"
    usage_max_age_s: float = Field(default=24 * 3600.0, description="retention of usage samples")
    decision_partitions: int = Field(
        default=16,
        ge=1,
        le=1024,
        description="partitions of the usage stream (by workload), shared by the decision "
        "replicas; set the same on every service. Change it only with the decision service "
        "caught up (docs/performance.md)",
    )
    fetch_batch: int = Field(default=64, ge=1, le=10_000)
    max_deliver: int = Field(
        default=5, ge=1, description="deliveries before a message is dead-lettered"
    )
    ack_wait_s: float = Field(
        default=30.0,
        gt=0,
        description="a consumed message not acknowledged this long (its consumer died) is "
        "delivered again; a handler still working keeps it with progress acks",
    )
    gpu_prices: dict[str, UsdPerHour] = Field(
        default_factory=dict,
        description="USD per whole GPU-hour by GPU model (JSON), added to the built-in table",
    )
    gpu_default_price: UsdPerHour | None = Field(
        default=None, description="USD per GPU-hour for models not in the table"
    )

    @property
    def prices(self) -> GpuPrices:
        return GpuPrices.with_overrides(self.gpu_prices, self.gpu_default_price)
