"""`recalld serve`'s start-up line: where the web client is and whether a chat model is set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import apsw

from tests.conftest import TOKEN, make_config, running
from tests.daemon import Daemon
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_cli import recalld


def ready_line(daemon: Daemon) -> dict[str, Any]:
    """Stop the daemon and return its ``recalld.ready`` log record (read after the stop, so a
    daemon that never logs one fails the test rather than hanging it)."""
    _, rest = daemon.stop()
    records = [*daemon.lines,
               *(json.loads(line) for line in rest.splitlines() if line.startswith("{"))]
    found: list[dict[str, Any]] = [r for r in records if r.get("event") == "recalld.ready"]
    assert found, records
    return found[0]


def test_startup_line_names_the_web_client_and_no_chat_model(tmp_path: Path) -> None:
    """Without a model endpoint the ready line gives the page's http:// address and says that
    no chat model is configured."""
    daemon = Daemon(tmp_path / "data")
    ready = ready_line(daemon)
    assert ready["web"] == f"http://127.0.0.1:{daemon.port}/"
    assert ready["chat"].startswith("no model configured")


async def test_startup_line_names_the_chat_model(tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    """With a model endpoint the ready line names the model and where it is served."""
    daemon = Daemon(tmp_path / "data", env={"OPENAI_BASE_URL": fake_openai.base_url,
                                            "RECALLD_LLM_MODEL": "fake-model"})
    ready = ready_line(daemon)
    assert ready["chat"] == f"model fake-model at {fake_openai.base_url}"


async def test_serve_refuses_an_index_a_newer_version_migrated_and_keeps_it(
        tmp_path: Path) -> None:
    """`recalld serve` on a data dir whose memory.db records a migration newer than this
    version's exits 1 with one line naming it, and leaves the file as it was (not moved aside
    and rebuilt as an unreadable one would be)."""
    data = tmp_path / "data"
    async with running(make_config(data)):
        pass
    db = apsw.Connection(str(data / "memory.db"))
    db.execute("INSERT INTO migrations VALUES ('m099_newer', '2030-01-01T00:00:00+00:00')")
    db.close()
    done = recalld("--data-dir", str(data), "serve", "--port", "0",
                   env={"RECALLD_TOKEN": TOKEN, "RECALLD_MEMORY_EMBEDDER": "none"})
    assert done.returncode == 1, done.stderr
    assert ("recalld: the database was migrated by a newer recalld (m099_newer in migrations)"
            in done.stderr)
    assert "Traceback" not in done.stderr
    assert not list(data.glob("memory.db.corrupt-*"))
    db = apsw.Connection(str(data / "memory.db"))
    assert ("m099_newer",) in db.execute("SELECT name FROM migrations").fetchall()
