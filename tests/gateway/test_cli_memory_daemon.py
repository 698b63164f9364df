"""`recalld memory …` beside a running daemon: status and search asked of the daemon over the
gateway, and what `memory index` leaves pending handed to the daemon's embedder."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from gateway.client import Client
from sessions.store import SessionStore
from tests.conftest import TOKEN
from tests.daemon import Daemon
from tests.fake_openai import FakeOpenAI

# Run in the child: the command, then which heavy modules it imported, as the last stderr line.
_PROBE = ("import sys; from gateway.cli.main import main; code = main(sys.argv[1:]); "
          "heavy = sorted(m for m in ('openai', 'gateway.app', 'gateway.chat', 'onnxruntime') "
          "if m in sys.modules); print('imported:', ','.join(heavy), file=sys.stderr); "
          "sys.exit(code)")


def seed(data_dir: Path, sessions: int = 3) -> None:
    store = SessionStore(data_dir)
    for n in range(sessions):
        s = store.create("default", title=f"talk {n}")
        store.append_message("default", s.session_key, role="user",
                             content=f"My favourite programming language number {n} is Rust.")
        store.append_message("default", s.session_key, role="assistant",
                             content=f"Noted, number {n}!")
    store.close()


async def recalld(data_dir: Path, *args: str,
                  env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The CLI as a child process; awaited, so the fake model (this loop) keeps serving."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PROBE, "--data-dir", str(data_dir), *args,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**base, "RECALLD_TOKEN": TOKEN, "RECALLD_MEMORY_EMBEDDER": "none", **(env or {})})
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def daemon_status(daemon: Daemon) -> dict[str, Any]:
    async with Client.connect(daemon.url, TOKEN) as c:
        status: dict[str, Any] = await c.call("memory.status")
        return status


async def wait_embedded(daemon: Daemon, timeout: float = 60.0) -> dict[str, Any]:
    """Poll the daemon until every chunk has a vector (generous: the machine may be busy)."""
    async with asyncio.timeout(timeout):
        while True:
            status = await daemon_status(daemon)
            if (status["chunks"] and status["embedded"] == status["chunks"]
                    and not status["syncing"]):
                return status
            await asyncio.sleep(0.2)


async def test_status_and_search_are_the_daemons_answers(tmp_path: Path) -> None:
    """Beside a daemon, `memory status` and `memory search` print the daemon's own answers,
    importing neither the chat stack nor an embedder; `search --user` reads the index here."""
    data = tmp_path / "data"
    seed(data)
    daemon = Daemon(data, env={"RECALLD_MEMORY_WATCH": "false"})
    try:
        async with asyncio.timeout(60):
            while (await daemon_status(daemon))["chunks"] == 0:
                await asyncio.sleep(0.2)
        code, out, err = await recalld(data, "memory", "status")
        assert code == 0, err
        assert (f"answered by  the daemon at {daemon.url}" in out
                and "3 (0 embedded, 3 pending)" in out)
        assert err.splitlines()[-1] == "imported: ", err
        code, out, err = await recalld(data, "memory", "status", "--json")
        assert json.loads(out)["syncCount"] >= 1  # the daemon's own count: this process ran no sync
        code, out, err = await recalld(data, "memory", "search",
                                       "favourite programming language", "--json")
        assert code == 0, err
        found = json.loads(out)
        assert (found["mode"] == "keyword" and len(found["results"]) == 3
                and "Rust" in found["results"][0]["content"])
        assert err.splitlines()[-1] == "imported: ", err
        code, out, err = await recalld(data, "memory", "search", "favourite", "--user", "default")
        assert code == 0 and "Rust" in out, err
        assert "gateway.app" in err.splitlines()[-1]  # opened the index itself,
                                                      # with the daemon's wiring
    finally:
        daemon.kill()


async def test_full_index_under_another_embedder_is_embedded_by_the_daemon(
        tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    """`memory index --full` run with an embedder other than the daemon's embeds nothing itself
    and hands the chunks it re-wrote to the daemon, which embeds them without waiting for a
    transcript to change."""
    data = tmp_path / "data"
    seed(data)
    daemon = Daemon(data, env={"RECALLD_MEMORY_EMBEDDER": "openai",
                               "OPENAI_BASE_URL": fake_openai.base_url,
                               "OPENAI_API_KEY": "sk-test", "RECALLD_MEMORY_WATCH": "false"})
    try:
        await wait_embedded(daemon)
        code, out, err = await recalld(data, "memory", "index", "--full")
        assert code == 0, err
        assert "embeds nothing" in err and "3 chunks written, 0 embedded" in out, (out, err)
        status = await wait_embedded(daemon, timeout=40)  # the review saw 0 of 20 after 40 s
        assert status["pending"] == 0 and status["embedded"] == 3
        assert f"the daemon at {daemon.url} embeds the 3 pending chunks now" in out
    finally:
        daemon.kill()


async def test_import_beside_a_daemon_says_what_the_index_holds(tmp_path: Path) -> None:
    """When `recalld import` finds nothing left to index beside a daemon, its summary says the
    daemon keeps the index and what it holds, not "0 chunks written"."""
    data = tmp_path / "data"
    source = tmp_path / "old"
    seed(source)
    export = tmp_path / "export.jsonl"
    export.write_text("".join(p.read_text()
                              for p in sorted((source / "sessions" / "default").glob("*.jsonl"))))
    daemon = Daemon(data, env={"RECALLD_MEMORY_WATCH": "false"})
    try:
        code, out, err = await recalld(data, "import", str(export))
        assert code == 0 and "3 chunks written" in out, (out, err)
        code, out, err = await recalld(data, "import", str(export))
        assert code == 0, err
        assert "0 chunks written" not in out, out
        assert (f"indexed: nothing left to do here; the daemon at {daemon.url} keeps this index, "
                "which holds 3 chunks (0 embedded, 3 pending)") in out, out
    finally:
        daemon.kill()
