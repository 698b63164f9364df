"""What a new user met running the CLI beside a daemon (issue 22, "found by a new user")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TOKEN
from tests.daemon import Daemon


def _env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    return {**base, **extra}


@pytest.fixture
def daemon(tmp_path: Path):  # type: ignore[no-untyped-def]
    d = Daemon(tmp_path / "data")
    yield d
    d.kill()


def test_a_closed_stdout_exits_quietly(daemon: Daemon) -> None:
    """`recalld call … | head` whose reader is gone prints nothing on stderr and exits as `cat`
    does (128 + SIGPIPE), not "cannot reach" with 1: the daemon was reached."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader left before the first byte
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gateway", "--data-dir", str(daemon.data_dir), "call", "rpc.discover",
             "--url", daemon.url], stdout=write_end, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, timeout=60, env=_env(RECALLD_TOKEN=TOKEN))
    finally:
        os.close(write_end)
    assert proc.stderr == ""
    assert proc.returncode == 141
