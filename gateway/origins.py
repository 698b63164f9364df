"""The Host and Origin rules every listener of the daemon applies (the WebSocket gateway and
`/mcp`): a DNS-rebinding name is refused, and a browser page may call only from an allowed origin.
Pure functions; each listener passes its own bind address, port and scheme."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

__all__ = ["host_allowed", "origin_allowed"]


def host_allowed(host_header: str, bind_host: str, allowed_hosts: Iterable[str]) -> bool:
    """Whether a ``Host`` header names this server: localhost, the bound address, an allowed
    name, or any IP literal (an IP literal cannot be a DNS-rebinding name: only names are
    refused)."""
    host = host_header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    if not host:
        return False
    if host in ("localhost", bind_host.lower()) or host in {h.lower() for h in allowed_hosts}:
        return True
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def origin_allowed(origin: str, host_header: str, *, port: int, page_scheme: str,
                   allowed_origins: Iterable[str]) -> bool:
    """Whether a browser ``Origin`` may call: an allowed origin, localhost on this port, or the page
    this server served from whatever address it was opened at — its Origin is exactly
    ``page_scheme`` plus the Host header, which has already passed :func:`host_allowed`, so a
    rebinding name or a foreign site never matches."""
    allowed = {o.rstrip("/").lower() for o in allowed_origins}
    for scheme in ("http", "https"):
        for name in ("localhost", "127.0.0.1", "[::1]"):
            allowed.add(f"{scheme}://{name}:{port}")
    allowed.add(f"{page_scheme}://{host_header.strip().lower()}")
    return origin.rstrip("/").lower() in allowed
