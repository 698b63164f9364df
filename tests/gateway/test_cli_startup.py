"""`recalld serve`'s start-up line: where the web client is and whether a chat model is set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.daemon import Daemon
from tests.fake_openai import FakeOpenAI


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
