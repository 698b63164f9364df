"""`recalld memory status|index|search` on a data dir, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sessions.store import SessionStore


def recalld(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    env["RECALLD_MEMORY_EMBEDDER"] = "none"
    return subprocess.run([sys.executable, "-m", "gateway", "--data-dir", str(data_dir),
                           "memory", *args],
                          capture_output=True, text=True, timeout=120, env=env,
                          stdin=subprocess.DEVNULL)


def seed(data_dir: Path) -> str:
    store = SessionStore(data_dir)
    session = store.create("default", title="langs")
    store.append_message("default", session.session_key, role="user",
                         content="My favourite programming language is Rust.")
    store.append_message("default", session.session_key, role="assistant", content="Noted!")
    store.close()
    return session.session_key


def test_index_then_search_finds_the_fact(tmp_path: Path) -> None:
    """`memory index` builds the index and `memory search` ranks the fact first."""
    key = seed(tmp_path)
    out = recalld(tmp_path, "index")
    assert out.returncode == 0, out.stderr
    assert "1 changed" in out.stdout and "chunks written" in out.stdout
    found = recalld(tmp_path, "search", "favourite programming language", "--json")
    assert found.returncode == 0, found.stderr
    top = json.loads(found.stdout)["results"][0]
    assert top["sessionKey"] == key and "Rust" in top["content"]
    human = recalld(tmp_path, "search", "favourite programming language")
    assert "Rust" in human.stdout and "searched keyword" in human.stderr


def test_index_resumes_without_redoing_work(tmp_path: Path) -> None:
    """A second `memory index` reads nothing again; an append is picked up alone; --full
    re-reads all."""
    key = seed(tmp_path)
    recalld(tmp_path, "index")
    assert "0 changed" in recalld(tmp_path, "index").stdout
    store = SessionStore(tmp_path)
    store.append_message("default", key, role="user", content="Also some Go.")
    store.close()
    assert "1 changed" in recalld(tmp_path, "index").stdout
    assert "1 changed" in recalld(tmp_path, "index", "--full").stdout


def test_status_reports_counts_and_why_no_vectors(tmp_path: Path) -> None:
    """`memory status` shows counts and says why vector search is off; --json is
    machine-readable."""
    seed(tmp_path)
    recalld(tmp_path, "index")
    status = json.loads(recalld(tmp_path, "status", "--json").stdout)
    assert status["files"] == 1 and status["chunks"] >= 1 and status["provider"] == "none"
    text = recalld(tmp_path, "status").stdout
    assert "chunks" in text and "not ready" in text


def test_memory_facts_add_list_update_delete(tmp_path: Path) -> None:
    """`memory facts` adds, lists, corrects (history kept) and deletes a fact on the index."""
    added = recalld(tmp_path, "facts", "--json", "add", "My cat is called Luna")
    assert added.returncode == 0, added.stderr
    fact_id = json.loads(added.stdout)["fact"]["id"]
    assert "Luna" in recalld(tmp_path, "facts").stdout
    fixed = json.loads(recalld(tmp_path, "facts", "--json", "update", str(fact_id),
                               "My cat is called Nova").stdout)
    assert fixed["action"] == "replaced" and fixed["fact"]["replaces"] == fact_id
    history = recalld(tmp_path, "facts", "history", str(fixed["fact"]["id"])).stdout
    assert "Luna" in history and "(replaced)" in history and "Nova" in history
    assert recalld(tmp_path, "facts", "delete", str(fixed["fact"]["id"])).returncode == 0
    assert "no facts remembered" in recalld(tmp_path, "facts", "list", "--all").stdout
    missing = recalld(tmp_path, "facts", "delete", "999")
    assert missing.returncode == 1 and "not found" in missing.stderr


async def test_status_says_which_model_serves_vectors_during_a_rebuild(tmp_path: Path) -> None:
    """Mid-rebuild, `memory status`'s table shows the progress and names the previous model
    that serves vector search meanwhile."""
    from gateway.cli.memory import status_rows
    from tests.memory.conftest import embedder_down, opened, quiet_config
    from tests.memory.test_rebuild_serving import factory_of, indexed_with_a, model_a, model_b

    await indexed_with_a(tmp_path)
    new = model_b()
    new.fail = embedder_down()  # the rebuild cannot progress
    async with opened(tmp_path, quiet_config(), new,
                      previous_embedder=factory_of(model_a())) as svc:
        rows = dict(status_rows(await svc.status()))
    assert rows["vector rebuild"] == ("0 of 2 chunks embedded; meanwhile fake model-a (the "
                                      "previous model) serves vector search")
    assert str(rows["vector search"]).startswith("not ready")
