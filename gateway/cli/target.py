"""Where a client command connects, and with which token: shared by ``call`` and ``chat``."""

from __future__ import annotations

import argparse
import os

from gateway.config import Config

__all__ = ["connection_target"]


def connection_target(config: Config, args: argparse.Namespace) -> tuple[str, str | None]:
    """The URL and token a client command should use."""
    host = config.server.host
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    scheme = "wss" if config.tls.cert else "ws"
    url = args.url or f"{scheme}://{host}:{config.server.port}/"
    token = args.token or os.environ.get("RECALLD_TOKEN") or config.auth.token
    if not token and config.auth.users:
        token = config.auth.users[0].token
    if not token:
        try:
            token = (config.data_dir / "token").read_text().strip()
        except FileNotFoundError:
            token = None
    return url, token
