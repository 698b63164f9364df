"""`recalld chat` end to end: a real daemon subprocess, the loopback fake model, piped stdin."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import TOKEN
from tests.daemon import Daemon
from tests.fake_openai import Behaviour, FakeOpenAI

KEY = re.compile(r"^session ([0-9a-f-]{16,})", re.MULTILINE)


@pytest.fixture
def daemon(tmp_path: Path, fake_openai: FakeOpenAI) -> Iterator[Daemon]:
    d = Daemon(tmp_path / "data",
               env={"OPENAI_BASE_URL": fake_openai.base_url, "RECALLD_LLM_MODEL": "fake-model"})
    yield d
    d.kill()


async def start_chat(daemon: Daemon, *args: str) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    env["RECALLD_TOKEN"] = TOKEN
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "--data-dir", str(daemon.data_dir), "chat", "--url",
        daemon.url, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env,
    )


async def chat(daemon: Daemon, *args: str, stdin: str = "") -> tuple[int, str, str]:
    """Run `recalld chat` with ``stdin`` piped in; awaiting keeps the fake model (this
    loop) serving."""
    proc = await start_chat(daemon, *args)
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def read_until(proc: asyncio.subprocess.Process, needle: str, seen: str = "") -> str:
    assert proc.stdout is not None
    async with asyncio.timeout(30):
        while needle not in seen:
            chunk = await proc.stdout.read(4096)
            assert chunk, f"stdout ended before {needle!r}: {seen!r}"
            seen += chunk.decode()
    return seen


def transcript(daemon: Daemon, key: str) -> list[dict[str, str]]:
    path = daemon.data_dir / "sessions" / "default" / f"{key}.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [line for line in lines if line.get("type") == "message"]


async def test_piped_conversation_streams_and_is_recorded(daemon: Daemon) -> None:
    """Two piped lines get streamed echo replies, exit 0 at EOF, and land in the transcript."""
    code, out, err = await chat(daemon, stdin="hello there\nsecond line\n")
    assert code == 0, err
    assert "Echo: hello there\n" in out and "Echo: second line\n" in out
    match = KEY.search(out)
    assert match, out
    messages = transcript(daemon, match.group(1))
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "hello there"), ("assistant", "Echo: hello there"),
        ("user", "second line"), ("assistant", "Echo: second line"),
    ]
    assert "Traceback" not in err


async def test_list_shows_sessions(daemon: Daemon) -> None:
    """`--list` prints each session's key, updated time and message count, then exits 0."""
    _, out, _ = await chat(daemon, stdin="remember me\n")
    key = KEY.search(out).group(1)  # type: ignore[union-attr]
    code, listing, err = await chat(daemon, "--list")
    assert code == 0, err
    row = next(line for line in listing.splitlines() if line.startswith(key))
    assert "2 msgs" in row and re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row)


async def test_session_flag_resumes_with_history(daemon: Daemon) -> None:
    """`--session KEY` shows recent history and continues the same transcript."""
    _, out, _ = await chat(daemon, stdin="my cat is called Miso\n")
    key = KEY.search(out).group(1)  # type: ignore[union-attr]
    code, out, err = await chat(daemon, "--session", key, stdin="what is my cat called?\n")
    assert code == 0, err
    assert f"session {key}" in out
    assert "user: my cat is called Miso" in out and "assistant: Echo: my cat is called Miso" in out
    assert "Echo: what is my cat called?" in out
    assert len(transcript(daemon, key)) == 4


async def test_commands_new_sessions_help_and_unknown(daemon: Daemon) -> None:
    """/new switches to a fresh session, /sessions lists both, /help and unknown commands answer."""
    code, out, err = await chat(
        daemon, stdin="one\n/new\ntwo\n/sessions\n/help\n/nope\n/quit\nnever sent\n")
    assert code == 0, err
    first, second = KEY.findall(out)
    assert first != second
    assert [m["content"] for m in transcript(daemon, second)] == ["two", "Echo: two"]
    assert out.count(first) >= 2 and out.count(second) >= 2  # announced and listed
    assert "/search QUERY" in out and "unknown command '/nope'" in err
    assert "never sent" not in out


async def test_search_prints_hits_or_a_clean_error(daemon: Daemon) -> None:
    """/search prints ranked hits with date and session, or one line saying why it cannot."""
    _, out, _ = await chat(daemon, stdin="my favourite language is Rust\n")
    key = KEY.search(out).group(1)  # type: ignore[union-attr]
    hit = re.compile(rf"^1\. \d{{4}}-\d\d-\d\d  session {key}  .*Rust", re.MULTILINE)
    async with asyncio.timeout(30):
        while True:  # the indexer is debounced: retry until the hit shows or search says it cannot
            code, out, err = await chat(daemon, stdin="/search favourite language\n")
            assert code == 0 and "Traceback" not in err, err
            if hit.search(out) or "search unavailable:" in err:
                break
            assert "no matches for 'favourite language'" in out
            await asyncio.sleep(0.3)


async def test_ctrl_c_aborts_the_streaming_reply_and_chat_goes_on(daemon: Daemon,
                                                                  fake_openai: FakeOpenAI) -> None:
    """SIGINT during a slow reply aborts it ([aborted]); the next line is answered; EOF exits 0."""
    fake_openai.configure(reply="slow " * 400, delta_delay_s=0.02)
    proc = await start_chat(daemon)
    assert proc.stdin is not None and proc.stderr is not None
    proc.stdin.write(b"tell me a long story\n")
    await proc.stdin.drain()
    seen = await read_until(proc, "slow slow")
    proc.send_signal(signal.SIGINT)
    seen = await read_until(proc, "[aborted]\n", seen)
    fake_openai.configure(reply="quick answer", delta_delay_s=0.0)
    proc.stdin.write(b"and now?\n")
    proc.stdin.close()
    rest, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err
    assert "quick answer\n" in rest.decode()
    assert "aborting" in err.decode() and "Traceback" not in err.decode()
    messages = transcript(daemon, KEY.search(seen).group(1))  # type: ignore[union-attr]
    assert messages[1]["role"] == "assistant" and messages[1]["content"].startswith("slow")
    assert len(messages[1]["content"]) < len("slow " * 400)


async def test_ctrl_c_when_idle_exits_130(daemon: Daemon) -> None:
    """SIGINT with no reply streaming exits with code 130 and no traceback."""
    proc = await start_chat(daemon)
    await read_until(proc, "session ")
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 130 and "Traceback" not in err.decode()


async def test_unknown_session_exits_1(daemon: Daemon) -> None:
    """An unknown `--session` key is one line on stderr and exit code 1."""
    code, _, err = await chat(daemon, "--session", "no-such-session")
    assert code == 1 and err.strip() == "recalld: unknown session no-such-session"


async def test_unreachable_url_exits_1(daemon: Daemon) -> None:
    """A URL nothing listens on names the URL and the reason in one line, exit code 1."""
    code, _, err = await chat(daemon, "--url", "ws://127.0.0.1:9/")
    assert code == 1
    assert (err.startswith("recalld: cannot connect to ws://127.0.0.1:9/:")
            and len(err.strip().splitlines()) == 1)


async def test_wrong_token_exits_1(daemon: Daemon) -> None:
    """A refused token says so in one line, exit code 1."""
    code, _, err = await chat(daemon, "--token", "wrong-token-0123456789")
    assert (code == 1
            and err.strip() == f"recalld: cannot connect to {daemon.url}: the token was refused")


async def test_regenerate_and_edit_commands(daemon: Daemon, fake_openai: FakeOpenAI) -> None:
    """/regenerate streams a new reply to the last message; /edit TEXT replaces the last message
    and streams its reply; history then shows only the latest versions, and the session, created
    without a title, has been named by the model."""
    fake_openai.script(Behaviour(), Behaviour(reply="Another take."))
    code, out, err = await chat(daemon, stdin="first try\n/regenerate\n/edit second try\n")
    assert code == 0, err
    assert "Echo: first try\n" in out and "Another take.\n" in out and "Echo: second try\n" in out
    key = KEY.search(out).group(1)  # type: ignore[union-attr]
    code, out, err = await chat(daemon, "--session", key)
    assert code == 0, err
    assert "user: second try" in out and "assistant: Echo: second try" in out
    assert "user: first try" not in out and "Another take." not in out
    assert "(Chat about first try, 5 messages)" in out


async def test_summary_command_and_resume_print_the_summary(tmp_path: Path,
                                                            fake_openai: FakeOpenAI) -> None:
    """Once messages left the model's window, `/summary` prints the session's summary and
    resuming the session prints it above the last messages."""
    from gateway.client import Client

    d = Daemon(tmp_path / "data", env={"OPENAI_BASE_URL": fake_openai.base_url,
                                       "RECALLD_LLM_MODEL": "fake-model",
                                       "RECALLD_CHAT_HISTORY_LIMIT": "2",
                                       "RECALLD_CHAT_COMPACTION_EVERY": "2"})
    try:
        fake_openai.compaction_behaviour = Behaviour(reply="They spoke of otters.")
        code, out, err = await chat(d, stdin="one\ntwo\nthree\n")
        assert code == 0, err
        key = KEY.search(out).group(1)  # type: ignore[union-attr]
        async with Client.connect(d.url, TOKEN) as c, asyncio.timeout(30):
            while (await c.call("sessions.get", {"sessionKey": key})).get("summary") is None:
                await asyncio.sleep(0.05)  # the summary is written in the background
        code, out, err = await chat(d, "--session", key, stdin="/summary\n")
        assert code == 0, err
        assert len(re.findall(r"earlier in this chat \(\d+ messages\): They spoke of otters\.\n",
                              out)) == 2
    finally:
        d.kill()


async def test_model_and_continue_commands(daemon: Daemon, fake_openai: FakeOpenAI) -> None:
    """/model shows the chat's model and those offered, /model NAME switches (a model not offered
    is refused with the gateway's reason), and /continue writes on a reply cut at the
    length limit."""
    fake_openai.script(Behaviour(reply="Half a", finish_reason="length"),
                       Behaviour(reply=" story."))
    code, out, err = await chat(daemon, stdin="tell me\n/continue\n/model\n/model fake-model\n"
                                              "/model gpt-9\n")
    assert code == 0, err
    assert "Half a" in out and " story.\n" in out
    assert "model: fake-model (offered: fake-model)\n" in out and "model: fake-model\n" in out
    assert "not offered here" in err
