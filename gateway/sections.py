"""The configuration's sections of the gateway itself, as frozen dataclasses with their defaults.

``gateway.config`` loads and checks them (with the sections ``sessions``, ``memory`` and
``storage`` define); a field's ``metadata`` holds the bounds ``load`` enforces. A comment above a
field says what it bounds and why its default is what it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "DEFAULT_PORT",
    "AuthConfig",
    "AuthUser",
    "ChatConfig",
    "ClusterConfig",
    "LimitsConfig",
    "LlmConfig",
    "LogConfig",
    "McpConfig",
    "QuotasConfig",
    "ServerConfig",
    "TlsConfig",
]

DEFAULT_PORT = 18789


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
    # Seconds a TCP connection on either port (the gateway's, /mcp's) may take to send a request's
    # headers; slower is closed (a slowloris would otherwise hold its descriptor until
    # open_timeout_s, or for ever on /mcp). Such sockets are also the first closed when the
    # descriptor budget is full.
    header_timeout_s: float = field(default=5.0, metadata=_limit(0.1))
    ping_interval_s: float = field(default=20.0, metadata=_limit(0))
    ping_timeout_s: float = field(default=20.0, metadata=_limit(0))
    close_timeout_s: float = field(default=5.0, metadata=_limit(0.1))
    max_connections: int = field(default=1024, metadata=_limit(1))
    # Authenticated connections of one user at once (never more than max_connections): one user
    # cannot hold every slot. Past it: HTTP 503 at the upgrade, or auth refused (-32004 /
    # close 1008).
    max_connections_per_user: int = field(default=64, metadata=_limit(1))
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
    # Seconds a one-time sign-in code (auth.code, what `recalld open` hands the browser)
    # stays valid.
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
    # Blocking jobs (store, SQLite) of one user in the worker threads at once; the rest wait.
    # One: a second job of a flooding user mostly queued on the store's index lock and the
    # interpreter lock, ahead of another user's job, for little throughput (docs/protocol.md).
    max_user_threads: int = field(default=1, metadata=_limit(1))
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
    # sessions.update, memory.facts.add and memory.facts.update per user per minute, each (a bucket
    # refilled continuously): an update line carries the whole prompt, so it writes as much
    # as a create.
    updates_per_minute: int = field(default=60, metadata=_limit(1))
    # Bytes of chat.send messages and system prompts per user per minute: far above typing, far
    # below a full disk.
    message_bytes_per_minute: int = field(default=4 * 1024 * 1024, metadata=_limit(1024))
    # Bytes of chat.send attachments (decoded) per user per minute: a bucket holding at least one
    # chat.max_attachment_bytes file.
    attachment_bytes_per_minute: int = field(default=64 * 1024 * 1024, metadata=_limit(1024))
    # Bytes of sessions.import data (a chat history from the web page) per user per minute: a
    # bucket holding at least one server.max_size call, so a 60 MB export takes about a minute.
    import_bytes_per_minute: int = field(default=64 * 1024 * 1024, metadata=_limit(1024))


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Run leases between nodes on one database (``storage.backend = "postgres"``;
    docs/scaling.md)."""

    # A run's lease on its session lasts this long past its node's last renew: a node that dies
    # or hangs mid-run has its run ended by another node about this long after (chat.error,
    # retryable), and a database outage longer than it ends the runs it interrupted.
    lease_ttl_s: float = field(default=10.0, metadata=_limit(1, 300))
    # How often a node renews its leases (and checkpoints the partial replies, and looks for
    # other nodes' expired ones): at most half the TTL, so one late renew loses nothing.
    lease_renew_s: float = field(default=2.5, metadata=_limit(0.1, 150))

    def __post_init__(self) -> None:
        if self.lease_renew_s * 2 > self.lease_ttl_s:
            raise ValueError("cluster.lease_renew_s must be at most half of cluster.lease_ttl_s")


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
    # The highest temperature a session may ask for (sessions.update {temperature}, from 0); the
    # API's own range is 0-2. A session without one sends none: the endpoint's default.
    max_temperature: float = field(default=2.0, metadata=_limit(0, 2))
    # The most reply tokens a session may ask for (sessions.update {maxTokens}), sent as
    # max_tokens; a session without one sends none. A lower setting also caps sessions that
    # chose more before.
    max_tokens_limit: int = field(default=32768, metadata=_limit(1))
    # Models that take images (chat.send attachments of image/*, sent as image_url parts); an
    # image sent to a session on any other model answers -32602.
    vision_models: tuple[str, ...] = ()

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
    # After a session's first reply, ask the model for a title (off the reply's path); off: none.
    auto_title: bool = True
    title_timeout_s: float = field(default=10.0, metadata=_limit(0.1))
    # Summarise what left the history window into the prompt (docs/protocol.md, "The model's
    # context"); acts only where a chat model is configured. Off: no summary is written or used.
    compaction: bool = True
    # A summary call once at least this many shown messages left the window unsummarised.
    compaction_every: int = field(default=10, metadata=_limit(1, 1000))
    # The summary's bound in tokens (the model's answer is cut to it).
    compaction_max_tokens: int = field(default=300, metadata=_limit(50, 4000))
    # One summary call's bound; a call that takes longer is dropped and tried at the next trigger.
    compaction_timeout_s: float = field(default=60.0, metadata=_limit(1))
    # Files one chat.send may carry (docs/protocol.md, "Attachments"), and the largest one after
    # base64 decoding. A whole call is one frame, so server.max_size bounds them together too:
    # the default is the largest file whose base64 fits in the default 4 MiB frame.
    max_attachments: int = field(default=8, metadata=_limit(0, 64))
    max_attachment_bytes: int = field(default=3 * 1024 * 1024, metadata=_limit(1))
    # The text kept of one text file or PDF: what the model is given and memory indexes (it is
    # written on the user's transcript line, bounded by sessions.max_line_bytes with the rest).
    attachment_text_chars: int = field(default=20_000, metadata=_limit(100, 1_000_000))
    # A PDF's pages read for text (the rest are left out), and the time one extraction may take:
    # a crafted PDF (a page bomb, a compression bomb) costs at most this.
    attachment_pdf_pages: int = field(default=200, metadata=_limit(1, 100_000))
    attachment_timeout_s: float = field(default=10.0, metadata=_limit(0.1))


@dataclass(frozen=True, slots=True)
class McpConfig:
    """The MCP server's streamable HTTP listener (docs/mcp.md); ``recalld mcp`` needs none."""

    # Port of /mcp, on server.host with [tls] as the gateway's; 0 leaves the listener off.
    port: int = field(default=0, metadata=_limit(0, 65535))
    # A request body's bound (never above server.max_size). A tool call's arguments are a query
    # or a fact of a few kB; the SDK parses a body on the event loop, so a 4 MiB one costs every
    # other user's calls tens of milliseconds. Larger bodies get 413 before they are read.
    max_request_bytes: int = field(default=256 * 1024, metadata=_limit(4096))
    # Requests of one user served at once; more wait, unread, for a place.
    max_requests_per_user: int = field(default=4, metadata=_limit(1, 1024))
    # Request body bytes one user may send a minute (at least one max_request_bytes body fits);
    # beyond, 429 with Retry-After, unread. Tool calls are a few kB: 16 MiB is thousands of them.
    request_bytes_per_minute: int = field(default=16 * 1024 * 1024, metadata=_limit(4096))
