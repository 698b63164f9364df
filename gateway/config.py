"""Configuration: TOML file, environment and CLI flags folded into frozen dataclasses, once.

Precedence, highest first: CLI flag > environment > file > default. Every key can be set from
the environment as ``RECALLD_<SECTION>_<KEY>``; a few well-known variables are honoured too
(``RECALLD_TOKEN``, ``RECALLD_HOME``, ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``). Unknown keys and
bad values are reported all together, one clear line per mistake, as :class:`ConfigError`.

Library packages (``sessions``, ``memory``) define their own section dataclasses; this module
only loads and checks them, so they never read the environment themselves.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
import types
import typing
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from gateway.storage import StorageConfig
from memory import MemoryConfig
from sessions import SessionsConfig

__all__ = [
    "AuthConfig",
    "AuthUser",
    "ChatConfig",
    "Config",
    "ConfigError",
    "LimitsConfig",
    "LlmConfig",
    "LogConfig",
    "McpConfig",
    "QuotasConfig",
    "ServerConfig",
    "TlsConfig",
    "load",
]

DEFAULT_PORT = 18789


class ConfigError(Exception):
    """One or more configuration mistakes; ``problems`` holds one line per mistake."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))
        self.problems = problems


def _limit(lo: float | None = None, hi: float | None = None) -> dict[str, Any]:
    return {"min": lo, "max": hi}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = field(default=DEFAULT_PORT, metadata=_limit(0, 65535))
    # Extra browser origins allowed besides the gateway's own.
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()  # extra Host names besides the bound address and localhost
    max_size: int = field(default=4 * 1024 * 1024, metadata=_limit(1024))
    max_queue: int = field(default=16, metadata=_limit(1))
    write_limit: int = field(default=32 * 1024, metadata=_limit(1024))
    open_timeout_s: float = field(default=10.0, metadata=_limit(0.1))
    ping_interval_s: float = field(default=20.0, metadata=_limit(0))
    ping_timeout_s: float = field(default=20.0, metadata=_limit(0))
    close_timeout_s: float = field(default=5.0, metadata=_limit(0.1))
    max_connections: int = field(default=1024, metadata=_limit(1))
    shutdown_grace_s: float = field(default=10.0, metadata=_limit(0))  # for runs, then cancelled
    # Descriptors kept for files and upstream sockets (max_connections fits the fd limit minus it).
    reserved_fds: int = field(default=256, metadata=_limit(16))


@dataclass(frozen=True, slots=True)
class AuthUser:
    name: str
    token: str


@dataclass(frozen=True, slots=True)
class AuthConfig:
    mode: Literal["token", "none"] = "token"
    token: str | None = None
    users: tuple[AuthUser, ...] = ()
    timeout_s: float = field(default=10.0, metadata=_limit(0.1))
    preauth_max_size: int = field(default=64 * 1024, metadata=_limit(256))
    # Connections not authenticated yet, in all and per address: past either, HTTP 503.
    max_pending: int = field(default=256, metadata=_limit(1))
    max_pending_per_address: int = field(default=64, metadata=_limit(1))
    max_failures: int = field(default=10, metadata=_limit(1))
    failure_window_s: float = field(default=60.0, metadata=_limit(1))
    lockout_s: float = field(default=300.0, metadata=_limit(1))
    # Failures from all addresses per failure_window_s before all are locked out (gateway/auth.py).
    global_max_failures: int = field(default=100, metadata=_limit(1))
    # Seconds a one-time sign-in code (auth.code, what `recalld open` hands the browser) stays valid.
    code_ttl_s: float = field(default=30.0, metadata=_limit(1, 600))
    # The one user who sees and reindexes the whole index (else each user sees their own).
    admin: str | None = None


@dataclass(frozen=True, slots=True)
class TlsConfig:
    cert: str | None = None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_batch: int = field(default=50, metadata=_limit(1, 10_000))
    # Requests one connection may have running at once; past it: -32004.
    max_inflight: int = field(default=32, metadata=_limit(1))
    # Requests of one user running at once over all their connections; the rest wait their turn.
    max_user_running: int = field(default=8, metadata=_limit(1))
    # Bytes of undelivered events per connection before it is closed 1008 "slow consumer".
    max_outbox_bytes: int = field(default=8 * 1024 * 1024, metadata=_limit(1024))
    # Seconds between two memory.reindex {full: true} of one user; sooner: -32004.
    full_reindex_interval_s: float = field(default=60.0, metadata=_limit(0))
    # Bytes of replies one connection may hold unwritten; past it -32004 (-32600 if alone larger).
    max_reply_bytes: int = field(default=32 * 1024 * 1024, metadata=_limit(1024))
    # The same for all of one user's connections together (at least max_reply_bytes).
    max_user_reply_bytes: int = field(default=64 * 1024 * 1024, metadata=_limit(1024))
    # Pings and pongs a peer may send per second; more closes the connection 1008.
    max_control_frames_per_s: int = field(default=20, metadata=_limit(1))


@dataclass(frozen=True, slots=True)
class QuotasConfig:
    """Per-user (and global) limits on work a client can start; past them: -32004."""

    # sessions.create per user per minute (a bucket refilled continuously).
    sessions_per_minute: int = field(default=60, metadata=_limit(1))
    # Sessions with a reply being generated or queued, all users together and per user.
    max_runs: int = field(default=64, metadata=_limit(1))
    max_runs_per_user: int = field(default=16, metadata=_limit(1))
    # memory.search calls (each may embed its query upstream) running at once per user.
    max_searches_per_user: int = field(default=4, metadata=_limit(1))
    # sessions.update, memory.facts.add and memory.facts.update per user per minute, each (a bucket refilled
    # continuously): an update line carries the whole prompt, so it writes as much as a create.
    updates_per_minute: int = field(default=60, metadata=_limit(1))
    # Bytes of chat.send messages per user per minute: far above typing, far below a full disk.
    message_bytes_per_minute: int = field(default=4 * 1024 * 1024, metadata=_limit(1024))


@dataclass(frozen=True, slots=True)
class LogConfig:
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"


@dataclass(frozen=True, slots=True)
class LlmConfig:
    base_url: str | None = None
    api_key: str | None = None
    model: str = "gpt-4o-mini"
    # Other models a session may choose (sessions.create {model}); all go out on the operator's key.
    models: tuple[str, ...] = ()
    timeout_s: float = field(default=60.0, metadata=_limit(0.1))
    connect_timeout_s: float = field(default=10.0, metadata=_limit(0.1))
    max_retries: int = field(default=2, metadata=_limit(0, 10))

    def choices(self) -> tuple[str, ...]:
        """The models a session may run on: the configured one first, then ``models``."""
        return (self.model, *(m for m in dict.fromkeys(self.models) if m != self.model))


@dataclass(frozen=True, slots=True)
class ChatConfig:
    recall: bool = True
    recall_k: int = field(default=6, metadata=_limit(1, 50))
    history_limit: int = field(default=20, metadata=_limit(1, 1000))
    max_context_tokens: int = field(default=6000, metadata=_limit(256))
    max_message_bytes: int = field(default=256 * 1024, metadata=_limit(1))
    idempotency_ttl_s: float = field(default=300.0, metadata=_limit(1))
    # Runs waiting per session before chat.send answers -32003.
    max_queued_runs: int = field(default=32, metadata=_limit(1))
    # Model requests per run that may end in memory tool calls; the last round offers no tools.
    max_tool_rounds: int = field(default=3, metadata=_limit(1, 10))
    # The user's time zone (IANA name): episodes are dated, and time phrases read, in it.
    timezone: str = "UTC"


@dataclass(frozen=True, slots=True)
class McpConfig:
    """The MCP server's streamable HTTP listener (docs/mcp.md); ``recalld mcp`` needs none."""

    # Port of /mcp, on server.host with [tls] as the gateway's; 0 leaves the listener off.
    port: int = field(default=0, metadata=_limit(0, 65535))


@dataclass(frozen=True, slots=True)
class Config:
    data_dir: Path = field(default_factory=lambda: Path("~/.recalld").expanduser())
    server: ServerConfig = field(default_factory=ServerConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    log: LogConfig = field(default_factory=LogConfig)
    llm: LlmConfig = field(default_factory=LlmConfig)
    chat: ChatConfig = field(default_factory=ChatConfig)
    sessions: SessionsConfig = field(default_factory=SessionsConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    quotas: QuotasConfig = field(default_factory=QuotasConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    mcp: McpConfig = field(default_factory=McpConfig)
    config_path: Path | None = None


_SECTIONS: dict[str, type[Any]] = {
    name: tp
    for name, tp in typing.get_type_hints(Config).items()
    if name not in ("data_dir", "config_path")
}

# Well-known variables, applied below the RECALLD_<SECTION>_<KEY> form.
_ALIASES: dict[str, tuple[str, str]] = {
    "RECALLD_TOKEN": ("auth", "token"),
    "OPENAI_API_KEY": ("llm", "api_key"),
    "OPENAI_BASE_URL": ("llm", "base_url"),
}


def load(
    path: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    data_dir: Path | None = None,
) -> Config:
    """Build the one :class:`Config`: defaults < file < environment < ``overrides`` (CLI flags).

    ``path`` is the ``--config`` flag; without it ``./config.toml`` then
    ``<data dir>/config.toml`` are tried. Raises :class:`ConfigError` listing every mistake.
    """
    env = os.environ if env is None else env
    problems: list[str] = []
    if data_dir is None and env.get("RECALLD_HOME"):
        data_dir = Path(env["RECALLD_HOME"])
    raw: dict[str, Any] = {}
    config_path = path
    if config_path is None:
        for candidate in (Path("config.toml"), (data_dir or Config().data_dir) / "config.toml"):
            if candidate.is_file():
                config_path = candidate
                break
    if config_path is not None:
        try:
            raw = tomllib.loads(config_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError([f"config file not found: {config_path}"]) from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError([f"{config_path}: not valid TOML: {exc}"]) from None
    if data_dir is None and "data_dir" in raw:
        data_dir = Path(str(raw["data_dir"]))
    for key in raw:
        if key != "data_dir" and key not in _SECTIONS:
            problems.append(f"unknown section [{key}] (known: {', '.join(_SECTIONS)})")

    # key -> (value, where it came from, whether it is an environment string to parse)
    layers: dict[str, dict[str, tuple[Any, str, bool]]] = {name: {} for name in _SECTIONS}
    for name in _SECTIONS:
        section = raw.get(name, {})
        if not isinstance(section, dict):
            problems.append(f"[{name}] must be a table")
            continue
        for key, value in section.items():
            layers[name][key] = (value, f"[{name}] {key}", False)
    for var, (name, key) in _ALIASES.items():
        if env.get(var):
            layers[name][key] = (env[var], var, True)
    for var, value in env.items():
        if not var.startswith("RECALLD_") or var in _ALIASES or var == "RECALLD_HOME":
            continue
        rest = var[len("RECALLD_"):].lower()
        name, _, key = rest.partition("_")
        if name in _SECTIONS and key:
            layers[name][key] = (value, var, True)
    for name, values in (overrides or {}).items():
        for key, value in values.items():
            if value is not None:
                layers[name][key] = (value, f"--{key.replace('_', '-')}", False)

    sections: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        sections[name] = _build_section(name, cls, layers[name], problems)
    if problems:
        raise ConfigError(problems)
    cfg = Config(
        data_dir=(data_dir or Config().data_dir).expanduser(),
        config_path=config_path,
        **sections,
    )
    _check_cross_field(cfg, problems)
    if problems:
        raise ConfigError(problems)
    return cfg


def _build_section(
    name: str, cls: type[Any], values: dict[str, tuple[Any, str, bool]], problems: list[str]
) -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, (value, origin, from_env) in values.items():
        if key not in fields:
            problems.append(f"{origin}: unknown key; [{name}] has: {', '.join(fields)}")
            continue
        try:
            converted = _convert(hints[key], value, from_env=from_env)
            meta = fields[key].metadata
            if isinstance(converted, int | float) and not isinstance(converted, bool):
                lo, hi = meta.get("min"), meta.get("max")
                if lo is not None and converted < lo:
                    raise ValueError(f"must be >= {lo}")
                if hi is not None and converted > hi:
                    raise ValueError(f"must be <= {hi}")
        except (TypeError, ValueError) as exc:
            problems.append(f"{origin}: {exc} (got {value!r})")
            continue
        kwargs[key] = converted
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        problems.append(f"[{name}]: {exc}")
        return cls()


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _convert(tp: Any, value: Any, *, from_env: bool) -> Any:
    """Coerce ``value`` to the annotated type ``tp``; strings from the environment are parsed."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        if value is None or (from_env and value == ""):
            return None
        errors: list[Exception] = []
        for arg in non_none:  # the first type that takes the value (memory.rerank: true or "auto")
            try:
                return _convert(arg, value, from_env=from_env)
            except (TypeError, ValueError) as exc:
                errors.append(exc)
        if len(errors) == 1:
            raise errors[0]
        raise TypeError(", or ".join(str(e) for e in errors))
    if origin is Literal:
        if value not in args:
            raise ValueError(f"must be one of {', '.join(map(str, args))}")
        return value
    if origin is tuple:
        item = args[0]
        if from_env and isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list | tuple):
            raise TypeError("must be a list")
        if dataclasses.is_dataclass(item):
            return tuple(_convert_table(item, v) for v in value)
        return tuple(_convert(item, v, from_env=from_env) for v in value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if from_env and isinstance(value, str) and value.lower() in _TRUE | _FALSE:
            return value.lower() in _TRUE
        raise TypeError("must be true or false")
    if tp is int:
        if isinstance(value, bool):
            raise TypeError("must be an integer")
        if isinstance(value, int):
            return value
        if from_env and isinstance(value, str):
            return int(value.replace("_", ""))
        raise TypeError("must be an integer")
    if tp is float:
        if isinstance(value, bool):
            raise TypeError("must be a number")
        if isinstance(value, int | float):
            return float(value)
        if from_env and isinstance(value, str):
            return float(value)
        raise TypeError("must be a number")
    if tp is str:
        if not isinstance(value, str):
            raise TypeError("must be a string")
        return value
    if tp is Path:
        if not isinstance(value, str):
            raise TypeError("must be a path string")
        return Path(value).expanduser()
    raise TypeError(f"unsupported setting type {tp!r}")


def _convert_table(cls: Any, value: Any) -> Any:
    if not isinstance(value, dict):
        raise TypeError(f"each entry must be a table with keys {[f.name for f in dataclasses.fields(cls)]}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(value) - names
    missing = names - set(value)
    if unknown or missing:
        raise ValueError(f"each entry needs exactly the keys {sorted(names)}")
    return cls(**{k: _convert(hints[k], v, from_env=False) for k, v in value.items()})


_LOOPBACK_HOSTS = {"127.0.0.1", "::1", "localhost"}


def is_loopback(host: str) -> bool:
    if host in _LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_cross_field(cfg: Config, problems: list[str]) -> None:
    if cfg.auth.mode == "none" and not is_loopback(cfg.server.host):
        problems.append(
            f"[auth] mode = \"none\" is refused on the non-loopback address {cfg.server.host}: "
            "anyone who can reach it would get full access. Bind 127.0.0.1 "
            "(--host 127.0.0.1) or use auth.mode = \"token\"."
        )
    if cfg.mcp.port and cfg.mcp.port == cfg.server.port:
        problems.append(f"[mcp] port {cfg.mcp.port} is [server] port too: give /mcp a port of its own")
    if bool(cfg.tls.cert) != bool(cfg.tls.key):
        problems.append("[tls] cert and key must be set together")
    try:
        zoneinfo.ZoneInfo(cfg.chat.timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        problems.append(f"[chat] timezone {cfg.chat.timezone!r} is not an IANA time zone name (e.g. \"Europe/Berlin\")")
    names = [u.name for u in cfg.auth.users]
    if len(set(names)) != len(names):
        problems.append("[[auth.users]] names must be unique")
    if cfg.auth.admin is not None and cfg.auth.users and cfg.auth.admin not in names:
        problems.append(f"[auth] admin = {cfg.auth.admin!r} names no [[auth.users]] entry (known: {', '.join(names)})")
    tokens = [u.token for u in cfg.auth.users]
    if len(set(tokens)) != len(tokens):
        problems.append("[[auth.users]] tokens must be unique")
    if any(len(t) < 16 for t in tokens) or (cfg.auth.token is not None and len(cfg.auth.token) < 16):
        problems.append("[auth] tokens must be at least 16 characters")
