"""`recalld mcp` on stdio, driven by the MCP SDK's own stdio client as Claude Desktop would."""

from __future__ import annotations

from pathlib import Path

from gateway.app import App
from gateway.client import Client
from tests.faults.helpers import free_port
from tests.mcp.conftest import TOKEN, said, stdio_session, tool

TOOLS = {"search_memory", "remember", "forget", "list_facts", "recent_sessions", "read_session"}


def _token_file(tmp_path: Path, token: str = TOKEN) -> str:
    path = tmp_path / "agent.token"
    path.write_text(token + "\n")
    return str(path)


async def test_stdio_lists_the_tools_and_finds_what_was_said_in_a_chat(mcp_app: App,
                                                                       tmp_path: Path) -> None:
    """`recalld mcp --url --token-file` lists the tools, and search_memory returns a sentence
    said in a chat, with its session's title, date and a reference that read_session follows."""
    key = await said(mcp_app, "My favourite programming language is Rust.", title="Languages")
    async with stdio_session(tmp_path / "elsewhere", "--url", mcp_app.url, "--token-file",
                             _token_file(tmp_path)) as session:
        listed = {t.name: t for t in (await session.list_tools()).tools}
        assert TOOLS <= set(listed)
        assert all(listed[name].description and listed[name].output_schema for name in TOOLS)
        found = await tool(session, "search_memory", query="favourite programming language")
        [hit] = found["excerpts"]
        assert "My favourite programming language is Rust." in hit["text"]
        assert (hit["session_title"], hit["session_key"]) == ("Languages", key)
        assert (hit["date"].startswith("20")
                and hit["reference"].startswith(f"recalld://sessions/{key}#lines="))
        page = await tool(session, "read_session", session_key=key, limit=1)
        assert [m["role"] for m in page["messages"]] == ["assistant"] and page["next"]
        earlier = await tool(session, "read_session", session_key=key, limit=1, before=page["next"])
        assert earlier["messages"][0]["content"] == "My favourite programming language is Rust."


async def test_stdio_remember_is_memory_facts_and_forget_removes_it(mcp_app: App,
                                                                    tmp_path: Path) -> None:
    """remember stores a fact memory.facts.list shows, with the daemon's dedup (the same fact
    again is `unchanged`); list_facts and the facts resource show it; forget by text deletes it,
    and a text that matches nothing deletes nothing and offers the closest facts."""
    async with stdio_session(tmp_path / "elsewhere", "--url", mcp_app.url, "--token-file",
                             _token_file(tmp_path)) as session, \
            Client.connect(mcp_app.url, TOKEN) as c:
        first = await tool(session, "remember", text="My daughter Luna is 3 years old")
        assert first["action"] == "added"
        again = await tool(session, "remember", text="my daughter luna is 3 years old.")
        assert again["action"] == "unchanged" and again["fact"]["id"] == first["fact"]["id"]
        facts = (await c.call("memory.facts.list"))["facts"]
        assert [f["text"] for f in facts] == ["My daughter Luna is 3 years old"]
        assert ([f["id"] for f in (await tool(session, "list_facts"))["facts"]]
                == [first["fact"]["id"]])
        resource = await session.read_resource("recalld://facts")
        assert "My daughter Luna is 3 years old" in resource.contents[0].text  # type: ignore[union-attr]
        missed = await tool(session, "forget", text="Luna likes trains")
        assert (missed["deleted"] is False
                and [f["id"] for f in missed["candidates"]] == [first["fact"]["id"]])
        gone = await tool(session, "forget", text="My daughter Luna is 3 years old.")
        assert gone["deleted"] is True and gone["fact"]["id"] == first["fact"]["id"]
        assert (await c.call("memory.facts.list"))["facts"] == []


async def test_stdio_never_shows_incognito_sessions(mcp_app: App, tmp_path: Path) -> None:
    """An incognito session is left out of recent_sessions, read_session refuses it like an
    unknown key, and search_memory never returns its words."""
    kept = await said(mcp_app, "The marmalade recipe uses Seville oranges.", title="Recipes")
    secret = await said(mcp_app, "My password hint is zanzibar.", memory=False)
    async with stdio_session(tmp_path / "elsewhere", "--url", mcp_app.url, "--token-file",
                             _token_file(tmp_path)) as session:
        listed = await tool(session, "recent_sessions")
        assert [s["session_key"] for s in listed["sessions"]] == [kept]
        refused = await session.call_tool("read_session", {"session_key": secret})
        assert refused.is_error and f"no session {secret}" in refused.content[0].text  # type: ignore[union-attr]
        assert (await tool(session, "search_memory", query="zanzibar"))["excerpts"] == []


async def test_stdio_without_a_daemon_a_tool_call_says_so(tmp_path: Path) -> None:
    """With no daemon at the URL the server still starts; a tool call fails with a message the
    model can read, naming the URL."""
    url = f"ws://127.0.0.1:{free_port()}/"
    async with stdio_session(tmp_path / "elsewhere", "--url", url, "--token-file",
                             _token_file(tmp_path)) as session:
        assert {t.name for t in (await session.list_tools()).tools} >= TOOLS
        result = await session.call_tool("list_facts", {})
        assert result.is_error
        assert f"cannot reach recalld at {url}" in result.content[0].text  # type: ignore[union-attr]
