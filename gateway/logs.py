"""structlog, configured once at start.

JSON lines when stderr is not a terminal, readable console lines when it is. Context bound
with ``structlog.contextvars`` (``conn``, ``user``, ``session``) is merged first, so every line
a connection's task writes carries it. The stdlib loggers (``websockets``, ``openai``) are
routed through the same renderer by ``ProcessorFormatter``.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from typing import Literal

import structlog

__all__ = ["configure_logging", "token_fingerprint"]

_configured = False


def configure_logging(
    level: str = "info",
    fmt: Literal["auto", "json", "console"] = "auto",
    *,
    stream: object | None = None,
) -> None:
    """Configure structlog and stdlib logging; later calls only change the level."""
    global _configured
    out = stream if stream is not None else sys.stderr
    numeric = logging.getLevelName(level.upper())
    use_json = fmt == "json" or (fmt == "auto" and not getattr(out, "isatty", lambda: False)())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            renderer,
        ],
    )
    handler = logging.StreamHandler(out)  # type: ignore[arg-type]
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_recalld", False):
            root.removeHandler(old)
    handler._recalld = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(numeric)
    # websockets logs every failed handshake at INFO with a traceback; keep it to warnings.
    logging.getLogger("websockets").setLevel(max(numeric, logging.WARNING))
    logging.getLogger("httpx").setLevel(max(numeric, logging.WARNING))
    logging.getLogger("httpx2").setLevel(max(numeric, logging.WARNING))
    _configured = True


def token_fingerprint(token: str) -> str:
    """What the log shows instead of a token: the first 8 hex digits of its SHA-256."""
    return hashlib.sha256(token.encode()).hexdigest()[:8]
