"""``<data dir>/daemon.json``: where the daemon serving a data dir can be reached.

The daemon writes ``{"url": ..., "pid": ...}`` once it listens and removes it at close; the
client commands (``recalld call``, ``recalld chat``) read it, so a daemon started on another
port (``--port 0``, a config in another place) is found without flags. A file left behind by a
daemon killed with -9 names a process that is gone, and is ignored.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import orjson

__all__ = ["RUNTIME_FILE", "client_url", "read_runtime_url", "remove_runtime_file", "write_runtime_file"]

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


def write_runtime_file(data_dir: Path, url: str) -> None:
    """Record this process's URL (0600, written then renamed so a reader never sees half)."""
    path = data_dir / RUNTIME_FILE
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, orjson.dumps({"url": url, "pid": os.getpid()}))
    finally:
        os.close(fd)
    os.replace(tmp, path)


def remove_runtime_file(data_dir: Path) -> None:
    """Remove the file if this process wrote it."""
    path = data_dir / RUNTIME_FILE
    with contextlib.suppress(OSError, orjson.JSONDecodeError, KeyError, TypeError):
        if orjson.loads(path.read_bytes())["pid"] == os.getpid():
            path.unlink()


def read_runtime_url(data_dir: Path) -> str | None:
    """The URL of the daemon serving ``data_dir``, or None when none is running there."""
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
    return url
