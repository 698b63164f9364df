"""``<data dir>/daemon.json``: where the daemon serving a data dir can be reached.

The daemon writes ``{"url": ..., "pid": ..., "embedder": [provider, model, endpoint hash] or
null}`` once it listens and removes it at close (the embedder is the one it indexes with, so that
a CLI command working on the same index never switches it: gateway.cli.embedder); the
client commands (``recalld call``, ``recalld chat``) read it, so a daemon started on another
port (``--port 0``, a config in another place) is found without flags. A file left behind by a
daemon killed with -9 names a process that is gone, and is ignored.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import orjson

__all__ = ["RUNTIME_FILE", "client_url", "read_runtime_embedder", "read_runtime_url",
           "remove_runtime_file", "write_runtime_file"]

RUNTIME_FILE = "daemon.json"


def client_url(scheme: str, host: str, port: int) -> str:
    """The URL a local client uses for a daemon bound to ``host``: a wildcard bind is reached
    on loopback."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}/"


def write_runtime_file(data_dir: Path, url: str,
                       embedder: tuple[str, str, str] | None = None) -> None:
    """Record this process's URL and embedder identity (0600, written then renamed so a reader
    never sees half)."""
    path = data_dir / RUNTIME_FILE
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, orjson.dumps({"url": url, "pid": os.getpid(), "embedder": embedder}))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def remove_runtime_file(data_dir: Path) -> None:
    """Remove the file if this process wrote it."""
    path = data_dir / RUNTIME_FILE
    with contextlib.suppress(OSError, orjson.JSONDecodeError, KeyError, TypeError):
        if orjson.loads(path.read_bytes())["pid"] == os.getpid():
            path.unlink()


def _live_record(data_dir: Path) -> dict[str, object] | None:
    try:
        record = orjson.loads((data_dir / RUNTIME_FILE).read_bytes())
        url, pid = record["url"], record["pid"]
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError):
        return None
    if not isinstance(url, str) or not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # it exists; another user's process
    return dict(record)


def read_runtime_url(data_dir: Path) -> str | None:
    """The URL of the daemon serving ``data_dir``, or None when none is running there."""
    record = _live_record(data_dir)
    return None if record is None else str(record["url"])


def read_runtime_embedder(data_dir: Path) -> tuple[bool, tuple[str, str, str] | None]:
    """(whether a daemon serves ``data_dir`` and published its embedder, that embedder's
    identity or None for none)."""
    record = _live_record(data_dir)
    if record is None or "embedder" not in record:
        return False, None
    value = record["embedder"]
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, str) for v in value):
        return True, (value[0], value[1], value[2])
    return True, None
