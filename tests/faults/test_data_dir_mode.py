"""Issue 22, item 9: a data dir the daemon's user owns is tightened to 0700 at start (logged
once); one it cannot tighten, because another user owns it, refuses the start with a message
naming the chmod that fixes it, before anything is written into it."""

from __future__ import annotations

import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TOKEN
from tests.daemon import Daemon


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_0755_data_dir_is_0700_after_start(tmp_path: Path) -> None:
    """mkdir'd 0755 by hand: after one start it is 0700, that start logs data_dir.tightened
    mode=0755 once, and the next start has nothing to tighten."""
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o755)
    daemon = Daemon(data)
    daemon.stop()
    tightened = [r for r in daemon.lines if r.get("event") == "data_dir.tightened"]
    assert mode_of(data) == 0o700
    assert len(tightened) == 1 and tightened[0]["mode"] == "0755", daemon.lines
    again = Daemon(data)
    again.stop()
    assert not [r for r in again.lines if r.get("event") == "data_dir.tightened"]
    assert mode_of(data) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the data dir to another user")
def test_a_data_dir_owned_by_another_user_refuses_to_start(tmp_path: Path) -> None:
    """A 0755 data dir owned by `nobody` is not ours to chmod (not even as root): `recalld
    serve` exits 1 naming the directory and `chmod 0700`, and leaves no file in it."""
    data = tmp_path / "data"
    data.mkdir()
    nobody = pwd.getpwnam("nobody")
    os.chown(data, nobody.pw_uid, nobody.pw_gid)
    os.chmod(data, 0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    env.update({"RECALLD_TOKEN": TOKEN, "RECALLD_MEMORY_EMBEDDER": "none"})
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "--data-dir", str(data), "serve", "--port", "0"],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert f"data directory {data} has group or world access (0755)" in done.stderr
    assert f"chmod 0700 {data}" in done.stderr
    assert mode_of(data) == 0o755 and list(data.iterdir()) == []
