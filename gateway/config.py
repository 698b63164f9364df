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

from gateway.sections import (
    DEFAULT_PORT,
    AuthConfig,
    AuthUser,
    ChatConfig,
    ClusterConfig,
    LimitsConfig,
    LlmConfig,
    LogConfig,
    McpConfig,
    QuotasConfig,
    ServerConfig,
    TlsConfig,
)
from gateway.storage import StorageConfig
from memory import MemoryConfig
from sessions import SessionsConfig

__all__ = [
    "DEFAULT_PORT",
    "AuthConfig",
    "AuthUser",
    "ChatConfig",
    "ClusterConfig",
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


class ConfigError(Exception):
    """One or more configuration mistakes; ``problems`` holds one line per mistake."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("invalid configuration:\n  " + "\n  ".join(problems))
        self.problems = problems


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
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
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
        raise TypeError(
            f"each entry must be a table with keys {[f.name for f in dataclasses.fields(cls)]}")
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
        problems.append(
            f"[mcp] port {cfg.mcp.port} is [server] port too: give /mcp a port of its own")
    if bool(cfg.tls.cert) != bool(cfg.tls.key):
        problems.append("[tls] cert and key must be set together")
    try:
        zoneinfo.ZoneInfo(cfg.chat.timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        problems.append(f"[chat] timezone {cfg.chat.timezone!r} is not an IANA time zone name "
                        "(e.g. \"Europe/Berlin\")")
    names = [u.name for u in cfg.auth.users]
    if len(set(names)) != len(names):
        problems.append("[[auth.users]] names must be unique")
    if cfg.auth.admin is not None and cfg.auth.users and cfg.auth.admin not in names:
        problems.append(f"[auth] admin = {cfg.auth.admin!r} names no [[auth.users]] entry (known: "
                        f"{', '.join(names)})")
    tokens = [u.token for u in cfg.auth.users]
    if len(set(tokens)) != len(tokens):
        problems.append("[[auth.users]] tokens must be unique")
    if (any(len(t) < 16 for t in tokens)
            or (cfg.auth.token is not None and len(cfg.auth.token) < 16)):
        problems.append("[auth] tokens must be at least 16 characters")
