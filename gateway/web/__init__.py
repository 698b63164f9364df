"""The desktop web client: static files the gateway serves on its own port (``docs/web.md``).

The page speaks the JSON-RPC protocol over the same WebSocket as any client; this package only
holds its files and the code that answers plain HTTP GETs for them (:mod:`gateway.web.static`).
"""

from __future__ import annotations

from gateway.web.static import CSP, StaticSite, is_websocket_upgrade

__all__ = ["CSP", "StaticSite", "is_websocket_upgrade"]
