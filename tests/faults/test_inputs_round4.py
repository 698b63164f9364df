"""Hardening round 4, the low items (issue 33): system prompts spend the message-byte quota
(L1), the model allow-list holds at every run and at import (L3), a NUL is bad input on both
backends (L4), and ``recalld import`` checks what the RPC path checks (L7)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.cli.importer import session_key_for
from gateway.client import Client
from gateway.config import Config
from sessions import SessionStore
from sessions.transcript import HEADER_VERSION
from tests.conftest import TOKEN, running
from tests.fake_openai import FakeOpenAI
from tests.faults.test_quotas import USERS, two_users
from tests.faults.test_upstream import run_end
from tests.gateway.test_cli_import import _transcript_lines, recalld


async def test_system_prompts_spend_the_message_byte_quota(
    config_factory: Callable[..., Config]
) -> None:
    """The bytes of a system prompt (sessions.create and sessions.update) count against
    quotas.message_bytes_per_minute: past it -32004 naming the key and nothing is written; a
    call without a prompt, and another user, are not affected."""
    cfg = two_users(config_factory, quotas={"message_bytes_per_minute": 300_000,
                                            "sessions_per_minute": 1000,
                                            "updates_per_minute": 1000})
    prompt = "p" * 60_000  # five fill the bucket; it refills in 12 s per prompt
    async with running(cfg) as app, \
            Client.connect(app.url, USERS[0]["token"]) as alice, \
            Client.connect(app.url, USERS[1]["token"]) as bob:
        replies = [await alice.request("sessions.create", {"systemPrompt": prompt})
                   for _ in range(7)]
        assert [("result" in r) for r in replies] == [True] * 5 + [False] * 2, replies[-1]
        error = replies[5]["error"]
        assert (error["code"] == -32004
                and "quotas.message_bytes_per_minute" in error["message"]), error
        assert error["data"]["retryAfterMs"] > 0
        assert len((await alice.call("sessions.list"))["sessions"]) == 5
        key = replies[0]["result"]["sessionKey"]
        refused = await alice.request("sessions.update", {"sessionKey": key,
                                                          "systemPrompt": prompt + "!"})
        assert refused["error"]["code"] == -32004, refused
        assert (await alice.call("sessions.get", {"sessionKey": key}))["systemPrompt"] == prompt
        assert "result" in await alice.request("sessions.update", {"sessionKey": key,
                                                                   "title": "renamed"})
        assert "result" in await alice.request("sessions.create", {"title": "no prompt"})
        assert "result" in await bob.request("sessions.create", {"systemPrompt": prompt})


async def test_a_model_taken_off_the_list_is_refused_at_every_run(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A session whose model the operator removed from llm.models (then restarted) gets
    -32011 naming llm.models at chat.send and chat.regenerate, nothing is appended, and the
    model is never sent upstream again."""
    llm = {"base_url": fake_openai.base_url, "api_key": "sk-t", "model": "cheap-model",
           "max_retries": 0}
    offered = config_factory(llm={**llm, "models": ["big-model"]},
                             chat={"recall": False, "auto_title": False})
    async with running(offered) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create", {"model": "big-model"}))["sessionKey"]
        run = (await c.call("chat.send", {"sessionKey": key, "message": "hello"}))["runId"]
        assert (await run_end(c, run))["method"] == "chat.final"
    assert [r.json["model"] for r in fake_openai.chat_requests] == ["big-model"]
    withdrawn = config_factory(llm=llm, chat={"recall": False, "auto_title": False})
    async with running(withdrawn) as app, Client.connect(app.url, TOKEN) as c:
        for method, params in (("chat.send", {"sessionKey": key, "message": "again"}),
                               ("chat.send", {"sessionKey": key, "message": "again",
                                              "idempotencyKey": "k1"}),
                               ("chat.regenerate", {"sessionKey": key})):
            error = (await c.request(method, params))["error"]
            assert (error["code"] == -32011 and "llm.models" in error["message"]
                    and "big-model" in error["message"]), (method, error)
        assert (await c.call("sessions.get", {"sessionKey": key}))["messageCount"] == 2
        other = (await c.call("sessions.create"))["sessionKey"]
        run = (await c.call("chat.send", {"sessionKey": other, "message": "fine"}))["runId"]
        assert (await run_end(c, run))["method"] == "chat.final"
    assert [r.json["model"] for r in fake_openai.chat_requests] == ["big-model", "cheap-model"]


async def test_a_nul_is_invalid_params_on_both_backends(
    backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A NUL in chat.send's idempotencyKey or in a fact's text answers -32602 naming the field
    (never -32603 or a retryable storage error), on SQLite and PostgreSQL, and writes nothing."""
    cfg = backend_config_factory(llm={"base_url": fake_openai.base_url, "api_key": "sk-t",
                                      "max_retries": 0},
                                 chat={"recall": False, "auto_title": False})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        reply = await c.request("chat.send", {"sessionKey": key, "message": "hi",
                                              "idempotencyKey": "k\x00"})
        assert (reply["error"]["code"] == -32602
                and reply["error"]["data"]["field"] == "idempotencyKey"), reply
        assert (await c.call("sessions.get", {"sessionKey": key}))["messageCount"] == 0
        for method, params in (("memory.facts.add", {"text": "my cat is \x00 Luna"}),):
            error = (await c.request(method, params))["error"]
            assert error["code"] == -32602 and error["data"]["field"] == "text", error
        fact = (await c.call("memory.facts.add", {"text": "my cat is Luna"}))["fact"]
        error = (await c.request("memory.facts.update", {"id": fact["id"],
                                                         "text": "\x00"}))["error"]
        assert error["code"] == -32602 and error["data"]["field"] == "text", error
        assert [f["text"] for f in (await c.call("memory.facts.list"))["facts"]] == [
            "my cat is Luna"]
        run = (await c.call("chat.send", {"sessionKey": key, "message": "hi",
                                          "idempotencyKey": "k"}))["runId"]
        assert (await run_end(c, run))["method"] == "chat.final"


async def test_a_title_with_control_characters_is_refused_over_rpc(
    config_factory: Callable[..., Config]
) -> None:
    """sessions.create and sessions.update refuse a title holding a NUL or a terminal escape
    with -32602 naming title, and keep nothing of it."""
    async with running(config_factory()) as app, Client.connect(app.url, TOKEN) as c:
        for title in ("a\x00b", "red \x1b[31malert\x1b[0m", "two\nlines"):
            error = (await c.request("sessions.create", {"title": title}))["error"]
            assert error["code"] == -32602 and error["data"]["field"] == "title", (title, error)
        assert (await c.call("sessions.list"))["sessions"] == []
        key = (await c.call("sessions.create", {"title": "fine"}))["sessionKey"]
        assert (await c.request(
            "sessions.update", {"sessionKey": key, "title": "\x07bell"}))["error"]["code"] == -32602
        assert (await c.call("sessions.get", {"sessionKey": key}))["title"] == "fine"


def _import(tmp_path: Path, lines: list[dict[str, Any]]) -> tuple[Path, str]:
    """``lines`` as a JSONL file imported for user bo by `recalld import`, the daemon offering
    cheap-model and big-model; the data dir and the command's stderr."""
    dump, config, data = tmp_path / "export.jsonl", tmp_path / "config.toml", tmp_path / "data"
    dump.write_bytes(b"".join(json.dumps(line).encode() + b"\n" for line in lines))
    config.write_text('[llm]\nmodel = "cheap-model"\nmodels = ["big-model"]\n')
    out = recalld(data, "--config", str(config), "import", str(dump), "--user", "bo", "--no-index")
    assert out.returncode == 0, out.stderr
    return data, out.stderr


HEAD = {"type": "session", "version": HEADER_VERSION, "user": "old",
        "createdAt": "2024-02-01T10:00:00Z"}


def _message(n: int, role: str, **extra: Any) -> dict[str, Any]:
    return {"type": "message", "id": f"m{n}", "role": role, "content": f"text {n}",
            "ts": f"2024-02-01T10:00:0{n}Z", **extra}


def test_import_leaves_out_a_model_not_offered(tmp_path: Path) -> None:
    """`recalld import` of recalld JSONL leaves out a header model the daemon does not offer
    (llm.model, llm.models), saying so, and keeps an offered one."""
    data, err = _import(tmp_path, [
        {**HEAD, "sessionKey": "a" * 32, "title": "one", "model": "o1-pro-2025-03-19"},
        _message(1, "user"),
        {**HEAD, "sessionKey": "b" * 32, "title": "two", "model": "big-model"}, _message(2, "user"),
    ])
    assert "'o1-pro-2025-03-19' is not offered here" in err, err
    assert "model" not in _transcript_lines(data, "bo", session_key_for("bo", "jsonl", "a" * 32))[0]
    assert _transcript_lines(
        data, "bo", session_key_for("bo", "jsonl", "b" * 32))[0]["model"] == "big-model"


def test_import_applies_the_rpc_checks(tmp_path: Path) -> None:
    """`recalld import` of recalld JSONL cleans a title's NUL and terminal escapes (the
    characters sessions.create refuses) and drops extra keys from user lines, as chat.send
    writes none; replies keep theirs."""
    data, _ = _import(tmp_path, [
        {**HEAD, "sessionKey": "a" * 32, "title": "evil\x00 \x1b[2J\x1b[31mtitle"},
        _message(1, "user", model="o1-pro-2025-03-19", replaces="m0", anything={"x": 1}),
        _message(2, "assistant", model="m-1", finishReason="stop"),
    ])
    lines = _transcript_lines(data, "bo", session_key_for("bo", "jsonl", "a" * 32))
    assert lines[0]["title"] == "evil [2J [31mtitle", lines[0]
    assert {k for k in lines[1] if k not in ("id", "runId")} == {"type", "role", "content",
                                                                 "ts"}, lines[1]
    assert lines[2]["model"] == "m-1" and lines[2]["finishReason"] == "stop"
    with SessionStore(data) as store:
        assert [s.title for s in store.list("bo", limit=10)[0]] == ["evil [2J [31mtitle"]
