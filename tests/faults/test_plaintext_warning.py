"""Item 17 of issue 10: a plain ws:// bind on a non-loopback address is warned about at start,
loudly and once; loopback and TLS binds are not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.daemon import Daemon
from tests.faults.test_remote_clients import self_signed


def _warnings(data: Path, *args: str, env: dict[str, str] | None = None) -> list[dict[str, object]]:
    daemon = Daemon(data, *args, env=env)
    _, rest = daemon.stop()
    records = list(daemon.lines)
    for line in rest.splitlines():  # what came after the listening line
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return [r for r in records if r.get("event") == "gateway.plaintext_remote"]


def test_plain_ws_on_all_interfaces_is_warned_about(tmp_path: Path) -> None:
    """`serve --host 0.0.0.0` without TLS logs one warning that says tokens and messages cross
    the network unencrypted and points to docs/remote.md."""
    warnings = _warnings(tmp_path / "data", "--host", "0.0.0.0")
    assert len(warnings) == 1
    warning = warnings[0]
    assert warning["level"] == "warning" and "unencrypted" in str(warning["warning"])
    assert "docs/remote.md" in str(warning["fix"]) and str(warning["url"]).startswith("ws://")


@pytest.mark.parametrize("setup", ["loopback", "tls"])
def test_loopback_or_tls_binds_are_not_warned_about(tmp_path: Path, setup: str) -> None:
    """The default 127.0.0.1 bind, and 0.0.0.0 with [tls], start without that warning."""
    if setup == "loopback":
        assert _warnings(tmp_path / "data") == []
        return
    cert, key = self_signed(tmp_path)
    env = {"RECALLD_TLS_CERT": str(cert), "RECALLD_TLS_KEY": str(key)}
    assert _warnings(tmp_path / "data", "--host", "0.0.0.0", env=env) == []
