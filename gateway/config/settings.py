"""How the process runs, from the environment (``FAIRGATE_*``) and an optional ``.env`` file.

The admin's policy (users, limits, backends) lives in the YAML file named by ``FAIRGATE_CONFIG``;
see ``config/policy.py``. What is here cannot change without a restart.
"""

from __future__ import annotations

import difflib
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from gateway.core import zone_named

__all__ = [
    "IN_MEMORY",
    "Settings",
    "describe_settings",
    "parse_listen",
    "settings_errors",
    "settings_from",
    "variable",
]

IN_MEMORY = Path(":memory:")
"""FAIRGATE_USAGE_DB for usage kept in memory only (tools, demos): forgotten at exit."""

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class Settings(BaseSettings):
    """Process settings; every field is read from ``FAIRGATE_<NAME>``."""

    # Every number a finite one: FAIRGATE_BODY_TIMEOUT=inf would be a wait without a
    # deadline, FAIRGATE_REDIS_LEASE_SECONDS=inf holds that outlive their replica. No
    # setting is a yes/no, and a number's text means one number ("010" is 10, "2.0" is 2).
    model_config = SettingsConfigDict(
        env_prefix="FAIRGATE_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        allow_inf_nan=False,
    )

    config: Path = Field(
        default=Path("fairgate.yaml"),
        description="Path of the admin's YAML policy file (users, limits, backends).",
    )
    listen: str = Field(
        default="127.0.0.1:8080",
        description="HOST:PORT the gateway listens on; 0.0.0.0:PORT serves the LAN, [::]:PORT "
        "IPv6 too. A bare PORT means 127.0.0.1:PORT.",
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
        description="Most connections kept open to all backends together for relayed replies "
        "(probes, listings and keep-warm pings use up to 16 more).",
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
    usage_db: Path = Field(
        default=Path("fairgate-usage.db"),
        description="SQLite file that keeps each user's usage across restarts (created if "
        "missing; its directory must be writable); :memory: keeps it until exit. With "
        "FAIRGATE_REDIS_URL, usage is kept in Redis instead.",
    )
    usage_flush_seconds: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="Seconds between writes of usage to its store: what a crash can lose.",
    )
    time_zone: str = Field(
        default="",
        description="IANA time zone (e.g. Europe/Berlin) of the days, hours and minutes that "
        "budgets and usage reports count in; unset: the machine's.",
    )
    reload_interval: float = Field(
        default=1.0,
        gt=0,
        description="Seconds between checks of the policy file for changes (SIGHUP: at once).",
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        # Only a known level is upper-cased, so that an error shows the value as it was set.
        if isinstance(value, str) and value.upper() in _LEVELS:
            return value.upper()
        return value

    @field_validator("time_zone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        zone_named(value)
        return value

    @field_validator("listen")
    @classmethod
    def _host_and_port(cls, value: str) -> str:
        """Refuse what cannot be bound, rather than binding something else: a port past
        65535 would wrap around (99999 binds 34463) while the log said 99999."""
        host, port = parse_listen(value)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def host(self) -> str:
        return parse_listen(self.listen)[0]

    @property
    def port(self) -> int:
        return parse_listen(self.listen)[1]


def parse_listen(text: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT``, ``[IPv6]:PORT``, ``:PORT`` or a bare ``PORT`` (both
    on 127.0.0.1: a gateway reaches the LAN only when asked to); ValueError saying why not."""
    text = text.strip()
    if "://" in text:
        raise ValueError("write HOST:PORT without a scheme, e.g. 0.0.0.0:8080")
    if text.isdigit():
        host, port_text = "", text
    elif text.startswith("["):
        host, found, port_text = text[1:].partition("]:")
        if not found:
            raise ValueError("expected [IPv6]:PORT, e.g. [::]:8080")
    else:
        host, found, port_text = text.rpartition(":")
        if not found:
            raise ValueError("expected HOST:PORT, e.g. 127.0.0.1:8080, or a bare PORT")
        if ":" in host:
            raise ValueError("an IPv6 address goes in brackets, e.g. [::1]:8080")
    if not port_text.isdigit():
        raise ValueError(f"the port {port_text!r} is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is out of range (1-65535)")
    if any(c.isspace() or c in "/?#@[]" for c in host):
        raise ValueError(f"{host!r} is not a host name or address")
    return host or "127.0.0.1", port


class _GivenSettings(Settings):
    """Settings from their arguments only: neither ``os.environ`` nor ``.env`` is read."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def variable(variables: Mapping[str, str], name: str) -> str | None:
    """``name``'s value in ``variables``, its name matched in any case, as the settings match
    theirs (``settings_from``: of two spellings, the later)."""
    wanted, found = name.lower(), None
    for given, value in variables.items():
        if given.lower() == wanted:
            found = value
    return found


def settings_from(variables: Mapping[str, str]) -> Settings:
    """Settings read from ``variables`` alone, as a process with exactly that environment
    and no ``.env`` reads them (names in any case, as pydantic-settings matches them):
    what ``check-config`` builds for the environment systemd will give the service."""
    lowered = {name.lower(): value for name, value in variables.items()}
    given: dict[str, Any] = {
        name: lowered[variable]
        for name in Settings.model_fields
        if (variable := f"fairgate_{name}") in lowered
    }
    return _GivenSettings(**given)


def settings_errors(
    exc: ValidationError,
    flags: Mapping[str, str] | None = None,
    places: Mapping[str, str] | None = None,
) -> list[str]:
    """One line per invalid setting: where it was set (``places``: by field, e.g. the
    env file's ``path:line``), its name (the flag, when one set it), the value, and what it
    should be, instead of pydantic's multi-line report."""
    lines = []
    for error in exc.errors():
        field = str(error["loc"][0]) if error["loc"] else ""
        name = (flags or {}).get(field) or f"FAIRGATE_{field.upper()}"
        place = (places or {}).get(field, "fairgate")
        if error["type"] == "value_error":
            problem = str(error["ctx"]["error"])
        elif error["type"] == "literal_error":
            problem = f"must be {error['ctx']['expected']}"
        else:
            problem = error["msg"][:1].lower() + error["msg"][1:]
        lines.append(f"{place}: {name}={error['input']!r}: {problem}")
    return lines


def describe_settings() -> str:
    """Every ``FAIRGATE_*`` setting with its default and description (``serve --help``),
    generated from the fields so that the help cannot fall behind them."""
    lines = ["settings, from the environment or a .env file in the working directory:"]
    for name, field in Settings.model_fields.items():
        default = "unset" if field.default is None else str(field.default)
        lines.append(f"  FAIRGATE_{name.upper()}  (default: {default})")
        text = field.description or ""
        if get_origin(field.annotation) is Literal:
            text += " One of: " + ", ".join(map(str, get_args(field.annotation))) + "."
        lines += textwrap.wrap(text, 88, initial_indent=" " * 6, subsequent_indent=" " * 6)
    return "\n".join(lines)


# FAIRGATE_ variables that something other than the gateway's settings reads.
_READ_ELSEWHERE = frozenset({"FAIRGATE_KEY"})  # fairgate status's admin key


def unknown_variables(variables: Mapping[str, str | None]) -> list[str]:
    """A sentence for each FAIRGATE_ variable that names no setting, with the one it most
    likely meant: settings read only their own names, so a typo (FAIRGATE_LISTN) would
    leave its setting at the default without a word."""
    known = {f"FAIRGATE_{name.upper()}" for name in Settings.model_fields}
    sentences = []
    for name in sorted(variables):
        if name.startswith("FAIRGATE_") and name not in known | _READ_ELSEWHERE:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            guess = f"; did you mean {close[0]}?" if close else ""
            sentences.append(f"{name} names no setting{guess} (fine if an env: key reads it)")
    return sentences
