"""Run ``recalld serve`` as a real subprocess and find the port it chose (helpers for tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tests.conftest import TOKEN


class Daemon:
    """A ``recalld serve --port 0`` child process with its JSON log on a pipe."""

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        full_env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("RECALLD_", "OPENAI_"))}
        full_env.update({"RECALLD_TOKEN": TOKEN, "RECALLD_MEMORY_WATCH": "false",
                         "RECALLD_MEMORY_EMBEDDER": "none"})
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--data-dir", str(data_dir), "serve", "--port", "0",
             *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            text=True,
        )
        self.lines: list[dict[str, Any]] = []
        self.port = self._wait_for("gateway.listening")["port"]
        self.url = f"ws://127.0.0.1:{self.port}/"

    def _wait_for(self, event: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        assert self.proc.stderr is not None
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"daemon exited ({self.proc.poll()}) before {event}: "
                                   f"{self.lines}")
            try:
                record: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            self.lines.append(record)
            if record.get("event") == event:
                return record
        raise TimeoutError(event)

    def stop(self, sig: int = 15, timeout: float = 30.0) -> tuple[int, str]:
        """Send ``sig`` and return (exit code, the rest of stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        # Not communicate(): it reads the raw pipe and would drop whatever readline() above
        # already pulled into the text buffer (a record logged just after "listening").
        stdout, stderr = self.proc.stdout, self.proc.stderr
        assert stdout is not None and stderr is not None
        rest: list[str] = []
        readers = [threading.Thread(target=lambda: rest.append(stderr.read()), daemon=True),
                   threading.Thread(target=stdout.read, daemon=True)]
        for t in readers:
            t.start()
        code = self.proc.wait(timeout=timeout)
        for t in readers:
            t.join(timeout=timeout)
        stdout.close()
        stderr.close()
        return code, "".join(rest)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=30)
