"""How the process runs, from the environment (``FAIRGATE_*``) and an optional ``.env`` file.

The admin's policy (users, limits, backends) lives in the YAML file named by ``FAIRGATE_CONFIG``;
see ``policy.py``. What is here cannot change without a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Process settings; every field is read from ``FAIRGATE_<NAME>``."""

    model_config = SettingsConfigDict(
        env_prefix="FAIRGATE_", env_file=".env", env_file_encoding="utf-8", extra="ignore"
    )

    config: Path = Field(
        default=Path("fairgate.yaml"),
        description="Path of the admin's YAML policy file (users, limits, backends).",
    )
    listen: str = Field(
        default="127.0.0.1:8080",
        description="host:port the gateway listens on; use 0.0.0.0:PORT to serve the LAN.",
    )
    log_format: Literal["auto", "json", "console"] = Field(
        default="auto",
        description="json for production, console for a terminal; auto picks console on a TTY.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Lowest level of log lines written."
    )
    redis_url: str | None = Field(
        default=None,
        description="redis://host:port/db to share limits between replicas; unset = in-process.",
    )
    redis_lease_seconds: float = Field(
        default=12.0,
        gt=0,
        description="A replica's holds in Redis expire this long after it stops renewing them.",
    )
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024,
        gt=0,
        description="Largest request body accepted (images come base64-encoded); larger: 413.",
    )
    upstream_pool_size: int = Field(
        default=256,
        ge=1,
        description="Most connections kept open to all backends together.",
    )

    max_connections: int = Field(
        default=4096,
        ge=1,
        description="Most client connections open at once; at the cap the longest-idle one is "
        "closed for a new one, or the new one refused when none is idle.",
    )
    idle_timeout: float = Field(
        default=15.0,
        gt=0,
        description="Seconds a connection may sit without a complete request head (idle "
        "keep-alive, or headers sent slowly) before it is closed.",
    )
    body_timeout: float = Field(
        default=30.0,
        gt=0,
        description="Seconds a client may take to send a request body; slower: 408.",
    )
    max_reads_per_user: int = Field(
        default=4,
        ge=1,
        description="Listings and /api/show under way at once per user; more: 429.",
    )
    drain_timeout: float = Field(
        default=30.0,
        ge=0,
        description="On SIGTERM, seconds running requests may finish before their streams are "
        "ended with an in-band error; new requests get 503 shutting_down meanwhile.",
    )

    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        default="auto",
        description="uvloop relays each chunk at about two thirds of asyncio's CPU; auto uses "
        "it when it is installed.",
    )
    reload_interval: float = Field(
        default=1.0,
        gt=0,
        description="Seconds between checks of the policy file for changes (SIGHUP: at once).",
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0] or "127.0.0.1"

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])
