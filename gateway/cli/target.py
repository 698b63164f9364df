"""Where a client command connects, with which token and which TLS trust: shared by ``call``
and ``chat``.

The URL, highest first: ``--url``; ``$RECALLD_URL``; the address the daemon serving this data
dir wrote to ``<data dir>/daemon.json`` when it started (so ``serve --port 0`` then ``chat``
just works); the config's ``server.host``/``server.port``. The token: ``--token``;
``--token-file``; ``$RECALLD_TOKEN``; the config's ``auth.token`` or first ``[[auth.users]]``;
the data dir's generated ``token`` file. For ``wss://`` the system CA store is trusted, plus
``--cacert FILE`` (a self-signed certificate, or a private CA) and the daemon's own
``tls.cert`` when the config names one.
"""

from __future__ import annotations

import argparse
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from gateway.config import Config
from gateway.runtime import client_url, read_runtime_url

__all__ = ["Target", "TargetError", "add_connection_flags", "connection_target", "daemon_target"]


class TargetError(Exception):
    """A connection flag that cannot be used (an unreadable token file or CA file)."""


@dataclass(frozen=True, slots=True)
class Target:
    url: str
    token: str | None
    ssl: ssl.SSLContext | None  # set exactly when the URL is wss://


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="gateway URL (default $RECALLD_URL, then the running daemon's, "
                                 "then the config's)")
    p.add_argument("--token", help="token; visible to other local users in the process list: "
                                   "prefer --token-file or $RECALLD_TOKEN")
    p.add_argument("--token-file", type=Path, metavar="FILE", help="read the token from FILE")
    p.add_argument("--cacert", type=Path, metavar="FILE",
                   help="trust this CA or self-signed certificate (PEM) for wss://, besides the "
                        "system store")


def _config_url(config: Config) -> str:
    return client_url("wss" if config.tls.cert else "ws", config.server.host, config.server.port)


def _token(config: Config, args: argparse.Namespace | None) -> str | None:
    if args is not None and args.token:
        return str(args.token)
    token_file: Path | None = args.token_file if args is not None else None
    if token_file is not None:
        try:
            from_file = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise TargetError(f"cannot read the token file {token_file}: {exc}") from None
        if not from_file:
            raise TargetError(f"the token file {token_file} is empty")
        return from_file
    token: str | None = os.environ.get("RECALLD_TOKEN") or config.auth.token
    if not token and config.auth.users:
        token = config.auth.users[0].token
    if not token:
        try:
            token = (config.data_dir / "token").read_text().strip() or None
        except (FileNotFoundError, NotADirectoryError):
            token = None
    return token


def _ssl_context(config: Config, cacert: Path | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()  # the system CA store, hostname checked
    try:
        if cacert is not None:
            ctx.load_verify_locations(cafile=str(cacert))
        elif config.tls.cert:
            # The daemon's own certificate: trusting it makes a local self-signed setup work
            # with no flag; for a CA-signed one it adds nothing.
            ctx.load_verify_locations(cafile=config.tls.cert)
    except (OSError, ssl.SSLError) as exc:
        raise TargetError(f"cannot load the CA file {cacert or config.tls.cert}: {exc}") from None
    return ctx


def connection_target(config: Config, args: argparse.Namespace) -> Target:
    """The URL, token and TLS context a client command should use."""
    url = (args.url or os.environ.get("RECALLD_URL") or read_runtime_url(config.data_dir)
           or _config_url(config))
    context = _ssl_context(config, args.cacert) if url.startswith("wss://") else None
    return Target(url, _token(config, args), context)


def daemon_target(config: Config) -> Target | None:
    """The daemon serving this data dir (its ``daemon.json``), with the token and TLS trust a
    flagless client command would use; None when no daemon runs there. For the commands about
    this data dir's own index (``recalld memory status``), which must not reach another one
    through ``$RECALLD_URL``."""
    url = read_runtime_url(config.data_dir)
    if url is None:
        return None
    context = _ssl_context(config, None) if url.startswith("wss://") else None
    return Target(url, _token(config, None), context)
