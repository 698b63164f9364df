"""`recalld token add … --file` makes the file `recalld mcp --token-file` reads, as
docs/mcp.md says."""

from __future__ import annotations

from pathlib import Path

from gateway.app import App
from gateway.cli.main import main
from tests.mcp.conftest import BOB_TOKEN, TOKEN, said, stdio_session, tool


def _add(app: App, tmp_path: Path, *args: str) -> Path:
    """`recalld token add claude ARGS --user alice --file …` with the daemon's users in
    its config."""
    config = tmp_path / "config.toml"
    config.write_text(f'[[auth.users]]\nname = "alice"\ntoken = "{TOKEN}"\n'
                      f'[[auth.users]]\nname = "bob"\ntoken = "{BOB_TOKEN}"\n')
    token_file = tmp_path / "agents" / "claude.token"
    assert main(["--config", str(config), "--data-dir", str(app.config.data_dir), "token", "add",
                 "claude", *args, "--user", "alice", "--file", str(token_file)]) == 0
    return token_file


async def test_read_only_token_file_searches_but_remember_is_refused(mcp_app: App,
                                                                     tmp_path: Path) -> None:
    """With a read-only client token file, search_memory finds what was said, while remember
    is refused with the read-only error and saves nothing."""
    await said(mcp_app, "My favourite programming language is Rust.", title="Languages")
    token_file = _add(mcp_app, tmp_path, "--read-only")
    async with stdio_session(tmp_path / "elsewhere", "--url", mcp_app.url, "--token-file",
                             str(token_file)) as s:
        found = await tool(s, "search_memory", query="favourite programming language")
        assert "Rust" in found["excerpts"][0]["text"]
        refused = await s.call_tool("remember", {"text": "I like tea"})
        assert refused.is_error and "read-only" in refused.content[0].text  # type: ignore[union-attr]
        assert (await tool(s, "list_facts"))["facts"] == []


async def test_fact_remembered_through_a_named_token_shows_its_name(mcp_app: App,
                                                                    tmp_path: Path) -> None:
    """remember through a read-write client token saves a fact whose `client` is that
    token's name."""
    token_file = _add(mcp_app, tmp_path)
    async with stdio_session(tmp_path / "elsewhere", "--url", mcp_app.url, "--token-file",
                             str(token_file)) as s:
        saved = await tool(s, "remember", text="My daughter Luna is 3 years old")
        assert saved["action"] == "added"
        assert [f.get("client") for f in (await tool(s, "list_facts"))["facts"]] == ["claude"]
