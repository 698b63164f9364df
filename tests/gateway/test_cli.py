"""The `recalld` command as a user runs it: serve, call, token, and start-up refusals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.client import Client
from tests.conftest import TOKEN
from tests.daemon import Daemon


def recalld(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=60,
        env={**base, **(env or {})}, stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def daemon(tmp_path: Path):  # type: ignore[no-untyped-def]
    d = Daemon(tmp_path / "data")
    yield d
    d.kill()


async def test_sigterm_drains_and_exits_zero(daemon: Daemon) -> None:
    """SIGTERM closes connections 1001, shuts down in order and exits with code 0."""
    async with Client.connect(daemon.url, TOKEN) as c:
        assert (await c.call("gateway.health"))["status"] == "ok"
        code, rest = daemon.stop(signal.SIGTERM)
    assert code == 0
    assert '"app.closed"' in rest


def test_call_prints_the_result(daemon: Daemon) -> None:
    """`recalld call METHOD` connects with RECALLD_TOKEN and prints the result as JSON."""
    out = recalld("--data-dir", str(daemon.data_dir), "call", "gateway.health", "{}",
                  "--url", daemon.url, env={"RECALLD_TOKEN": TOKEN})
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["status"] == "ok"


def test_call_prints_errors_and_fails(daemon: Daemon) -> None:
    """An error reply is printed as JSON and the exit code is 1."""
    out = recalld("--data-dir", str(daemon.data_dir), "call", "sessions.get",
                  '{"sessionKey": "nope"}', "--url", daemon.url, env={"RECALLD_TOKEN": TOKEN})
    assert out.returncode == 1 and json.loads(out.stdout)["error"]["code"] == -32002


def test_call_with_bad_json_params_says_so(tmp_path: Path) -> None:
    """Params that are not JSON give a one-line message and exit code 2."""
    out = recalld("--data-dir", str(tmp_path), "call", "gateway.health", "{nope")
    assert out.returncode == 2 and "not valid JSON" in out.stderr


def test_token_show_and_rotate(tmp_path: Path) -> None:
    """`recalld token` creates and prints the token; --rotate replaces it."""
    first = recalld("--data-dir", str(tmp_path), "token")
    assert first.returncode == 0
    token = first.stdout.strip()
    assert (tmp_path / "token").read_text().strip() == token
    assert (tmp_path / "token").stat().st_mode & 0o777 == 0o600
    again = recalld("--data-dir", str(tmp_path), "token").stdout.strip()
    assert again == token
    rotated = recalld("--data-dir", str(tmp_path), "token", "--rotate").stdout.strip()
    assert rotated and rotated != token


def test_auth_none_on_public_bind_is_refused(tmp_path: Path) -> None:
    """Starting with auth.mode=none on 0.0.0.0 exits 2 with a message saying why and how
    to fix it."""
    out = recalld("--data-dir", str(tmp_path), "serve", "--host", "0.0.0.0", "--port", "0",
                  env={"RECALLD_AUTH_MODE": "none"})
    assert out.returncode == 2
    assert "refused" in out.stderr and "127.0.0.1" in out.stderr


def test_bad_config_value_is_one_clear_line(tmp_path: Path) -> None:
    """A bad value in the environment stops start-up with a message naming the variable."""
    out = recalld("--data-dir", str(tmp_path), "serve", env={"RECALLD_SERVER_PORT": "eighty"})
    assert out.returncode == 2 and "RECALLD_SERVER_PORT" in out.stderr
    assert "Traceback" not in out.stderr
