"""What the server enforces, gathered from the sections that hold it: one value built at the edge.

The listening address and the WebSocket limits are ``[server]``'s, the pre-authentication bounds
``[auth]``'s, the per-connection budgets ``[limits]``'s; :meth:`ServerSettings.from_config` takes
each field from the config key of the same name, so a field's meaning is its key's
(``config.example.toml``). A field whose use differs from its key's plain reading says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.config import Config

__all__ = ["ServerSettings"]


@dataclass(frozen=True, slots=True)
class ServerSettings:
    # [server]
    host: str
    port: int  # 0: the OS picks one; GatewayServer.port holds it once listening
    allowed_hosts: tuple[str, ...]
    allowed_origins: tuple[str, ...]
    # As configured: GatewayServer.start lowers it to fit the open-file limit less reserved_fds
    # (and a handshake slack), so GatewayServer.max_connections may be smaller.
    max_connections: int
    max_connections_per_user: int  # never above max_connections in effect (GatewayServer)
    reserved_fds: int
    max_size: int  # after authentication; preauth_max_size before it
    max_queue: int
    write_limit: int
    open_timeout_s: float
    header_timeout_s: float  # on the /mcp listener's sockets too (they share GatewayServer.sockets)
    ping_interval_s: float  # 0: no pings
    ping_timeout_s: float  # 0: no timeout
    close_timeout_s: float
    # [auth]
    auth_timeout_s: float  # auth.timeout_s
    preauth_max_size: int
    max_pending: int
    max_pending_per_address: int
    # [limits]
    max_inflight: int
    max_reply_bytes: int
    max_user_reply_bytes: int  # never below max_reply_bytes in effect (GatewayServer)
    max_outbox_bytes: int
    max_control_frames_per_s: int

    @classmethod
    def from_config(cls, config: Config) -> ServerSettings:
        s, auth, limits = config.server, config.auth, config.limits
        return cls(
            host=s.host, port=s.port,
            allowed_hosts=s.allowed_hosts, allowed_origins=s.allowed_origins,
            max_connections=s.max_connections, max_connections_per_user=s.max_connections_per_user,
            reserved_fds=s.reserved_fds,
            max_size=s.max_size, max_queue=s.max_queue, write_limit=s.write_limit,
            open_timeout_s=s.open_timeout_s, header_timeout_s=s.header_timeout_s,
            ping_interval_s=s.ping_interval_s, ping_timeout_s=s.ping_timeout_s,
            close_timeout_s=s.close_timeout_s,
            auth_timeout_s=auth.timeout_s, preauth_max_size=auth.preauth_max_size,
            max_pending=auth.max_pending, max_pending_per_address=auth.max_pending_per_address,
            max_inflight=limits.max_inflight, max_reply_bytes=limits.max_reply_bytes,
            max_user_reply_bytes=limits.max_user_reply_bytes,
            max_outbox_bytes=limits.max_outbox_bytes,
            max_control_frames_per_s=limits.max_control_frames_per_s,
        )
