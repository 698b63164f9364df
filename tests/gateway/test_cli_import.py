"""`recalld import FILE`: ChatGPT exports and recalld JSONL into transcripts, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gateway.cli.importer import import_conversations, session_key_for
from gateway.cli.importer_formats import parse
from sessions import SessionsConfig
from sessions.store import SessionStore


def recalld(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    env["RECALLD_MEMORY_EMBEDDER"] = "none"
    return subprocess.run([sys.executable, "-m", "gateway", "--data-dir", str(data_dir), *args],
                          capture_output=True, text=True, timeout=120, env=env,
                          stdin=subprocess.DEVNULL)


def _node(node_id: str, parent: str | None, children: list[str], role: str | None, text: Any,
          t: float | None = None, **meta: Any) -> dict[str, Any]:
    message = None if role is None else {
        "id": node_id, "author": {"role": role}, "create_time": t,
        "content": {"content_type": "text", "parts": [text]} if isinstance(text, str) else text,
        "metadata": meta,
    }
    return {"id": node_id, "parent": parent, "children": children, "message": message}


def chatgpt_export() -> list[dict[str, Any]]:
    """Two conversations shaped like ChatGPT's conversations.json; the first has an edited
    branch (b1 was regenerated as b2, and b2 is the current one) and a hidden system node."""
    first: dict[str, Any] = {
        "title": "Sourdough", "create_time": 1_700_000_000.0, "conversation_id": "c-1",
        "current_node": "b2", "mapping": {
            "root": _node("root", None, ["sys"], None, None),
            "sys": _node("sys", "root", ["u1"], "system", "",
                         is_visually_hidden_from_conversation=True),
            "u1": _node("u1", "sys", ["b1", "b2"], "user", "my starter is called Bubbles",
                        1_700_000_001.0),
            "b1": _node("b1", "u1", [], "assistant", "discarded branch", 1_700_000_002.0),
            "b2": _node("b2", "u1", ["u2"], "assistant", "Bubbles is a fine name", 1_700_000_003.0,
                        model_slug="gpt-4o"),
            "u2": _node("u2", "b2", ["img"], "user", {"content_type": "multimodal_text",
                                                      "parts": [{"asset_pointer": "file-x"},
                                                                "feed it rye flour"]},
                        1_700_000_004.0),
            "img": _node("img", "u2", [], "tool", "tool output", 1_700_000_005.0),
        },
    }
    first["current_node"] = "img"
    first["mapping"]["b2"]["children"] = ["u2"]
    second = {
        "title": "Bike", "create_time": 1_700_100_000.0, "id": "c-2", "current_node": "x2",
        "mapping": {
            "x1": _node("x1", None, ["x2"], "user", "the chain on my bike squeaks",
                        1_700_100_001.0),
            "x2": _node("x2", "x1", [], "assistant", "oil the chain", 1_700_100_002.0),
        },
    }
    return [first, second]


def _transcript_lines(data_dir: Path, user: str, key: str) -> list[dict[str, Any]]:
    path = data_dir / "sessions" / user / f"{key}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_chatgpt_export_becomes_sessions_of_the_user_and_is_searchable(tmp_path: Path) -> None:
    """A ChatGPT export imports the displayed thread of each conversation (no edited-away
    branch, system, tool or image parts) as the named user's sessions, then indexes them."""
    export = tmp_path / "conversations.json"
    export.write_text(json.dumps(chatgpt_export()))
    data = tmp_path / "data"
    out = recalld(data, "import", str(export), "--user", "maya")
    assert out.returncode == 0, out.stderr
    assert "2 new" in out.stdout and "5 messages written" in out.stdout and "indexed:" in out.stdout
    lines = _transcript_lines(data, "maya", session_key_for("maya", "chatgpt", "c-1"))
    assert (lines[0]["title"] == "Sourdough"
            and lines[0]["createdAt"].startswith("2023-11-14T22:13:20"))
    assert [(m["role"], m["content"]) for m in lines[1:]] == [
        ("user", "my starter is called Bubbles"), ("assistant", "Bubbles is a fine name"),
        ("user", "feed it rye flour")]
    assert lines[2]["model"] == "gpt-4o"
    found = recalld(data, "memory", "search", "starter Bubbles", "--user", "maya", "--json")
    assert "Bubbles" in json.loads(found.stdout)["results"][0]["content"]
    assert not (data / "sessions" / "default").exists()


def test_importing_twice_adds_nothing(tmp_path: Path) -> None:
    """A second import of the same file writes no message and creates no session."""
    export = tmp_path / "conversations.json"
    export.write_text(json.dumps(chatgpt_export()))
    data = tmp_path / "data"
    assert recalld(data, "import", str(export), "--no-index").returncode == 0
    before = {p.name: p.read_bytes() for p in (data / "sessions" / "default").iterdir()}
    again = recalld(data, "import", str(export), "--no-index")
    assert again.returncode == 0, again.stderr
    assert ("0 new" in again.stdout and "2 already complete" in again.stdout
            and "0 messages written" in again.stdout)
    assert {p.name: p.read_bytes() for p in (data / "sessions" / "default").iterdir()} == before


def test_an_interrupted_import_resumes_with_the_missing_messages(tmp_path: Path) -> None:
    """A transcript holding only the first messages of its conversation (an import cut short)
    gets exactly the rest appended, in order, on the next run."""
    conversations = parse(json.dumps(chatgpt_export()).encode())
    cut = [conversations[0].__class__(conversations[0].source_id, conversations[0].title,
                                      conversations[0].created_at, conversations[0].turns[:1])]
    data = tmp_path / "data"
    first = import_conversations(data, SessionsConfig(fsync="never"), "default", "chatgpt", cut)
    assert (first.created, first.messages) == (1, 1)
    report = import_conversations(data, SessionsConfig(fsync="never"), "default", "chatgpt",
                                  conversations)
    assert (report.created, report.resumed, report.messages) == (1, 1, 4)
    lines = _transcript_lines(data, "default", session_key_for("default", "chatgpt", "c-1"))
    assert [m["content"] for m in lines[1:]] == [
        "my starter is called Bubbles", "Bubbles is a fine name", "feed it rye flour"]


def test_recalld_jsonl_round_trips_roles_times_names_and_extra(tmp_path: Path) -> None:
    """recalld's own transcripts, concatenated into one JSONL file, import with their titles,
    roles, times, names and extra keys, under new keys for the importing user."""
    source = tmp_path / "source"
    with SessionStore(source, SessionsConfig(fsync="never")) as store:
        keys = []
        for title in ("alpha", "beta"):
            key = store.create("old", title=title, created_at="2024-02-01T10:00:00Z").session_key
            store.append_message("old", key, role="user", content=f"{title} question", name="Ana",
                                 ts="2024-02-01T10:00:05Z")
            store.append_message("old", key, role="assistant", content=f"{title} answer",
                                 run_id="r1", ts="2024-02-01T10:00:09Z",
                                 extra={"model": "m-1", "finishReason": "stop"})
            keys.append(key)
    dump = tmp_path / "export.jsonl"
    dump.write_bytes(b"".join((source / "sessions" / "old" / f"{k}.jsonl").read_bytes()
                              for k in keys))
    data = tmp_path / "data"
    out = recalld(data, "import", str(dump), "--user", "bo", "--no-index")
    assert out.returncode == 0, out.stderr
    assert "as jsonl" in out.stdout and "2 new" in out.stdout
    original = _transcript_lines(source, "old", keys[1])
    imported = _transcript_lines(data, "bo", session_key_for("bo", "jsonl", keys[1]))
    assert imported[0]["title"] == "beta" and imported[0]["user"] == "bo"
    drop = ("id", "runId")
    assert [{k: v for k, v in m.items() if k not in drop} for m in imported[1:]] == \
        [{k: v for k, v in m.items() if k not in drop} for m in original[1:]]


def test_malformed_file_is_refused_with_its_line_and_nothing_is_written(tmp_path: Path) -> None:
    """A JSONL file with a bad line, a file in no known format, or a missing file: one clear
    message naming the problem, exit 1, and no session is written."""
    good = tmp_path / "source"
    with SessionStore(good, SessionsConfig(fsync="never")) as store:
        key = store.create("u").session_key
        store.append_message("u", key, role="user", content="kept?")
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes((good / "sessions" / "u" / f"{key}.jsonl").read_bytes()
                       + b'{"type": "message", "role"\n')
    data = tmp_path / "data"
    out = recalld(data, "import", str(broken))
    assert out.returncode == 1 and "line 3" in out.stderr and "nothing was imported" in out.stderr
    assert "Traceback" not in out.stderr
    assert not list(data.glob("sessions/*/*.jsonl"))
    odd = tmp_path / "notes.txt"
    odd.write_text("just some notes")
    out = recalld(data, "import", str(odd))
    assert out.returncode == 1 and "not a ChatGPT" in out.stderr
    out = recalld(data, "import", str(tmp_path / "absent.json"))
    assert out.returncode == 1 and "cannot read" in out.stderr
    out = recalld(data, "import", str(broken), "--user", "no way")
    assert out.returncode in (1, 2) and "Traceback" not in out.stderr
