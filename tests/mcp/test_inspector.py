"""The MCP Inspector's CLI mode against `recalld mcp` and a running daemon: a client the
project did not write lists the tools and calls one."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from gateway.app import App
from tests.mcp.conftest import TOKEN, said

INSPECTOR = "@modelcontextprotocol/inspector@2.12.0"
# npx's own failures to fetch the package: no network here is a reason to skip, not a failure.
_OFFLINE = ("ENOTFOUND", "EAI_AGAIN", "ECONNREFUSED", "ETIMEDOUT", "network")


async def _inspector(tmp_path: Path, app: App, *method: str) -> object:
    token_file = tmp_path / "agent.token"
    token_file.write_text(TOKEN)
    env = {**os.environ, "npm_config_yes": "true", "npm_config_update_notifier": "false"}
    proc = await asyncio.create_subprocess_exec(
        "npx", "-y", INSPECTOR, "--cli",
        # The server it spawns imports this checkout (a worktree may differ from the install).
        "-e", f"PYTHONPATH={os.environ.get('PYTHONPATH') or Path(__file__).resolve().parents[2]}",
        sys.executable, "-m", "gateway", "--data-dir", str(tmp_path / "elsewhere"), "mcp",
        "--url", app.url, "--token-file", str(token_file), *method,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)
    try:
        async with asyncio.timeout(600):  # a hang guard (a first run downloads
                                          # the Inspector), not a timing
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0 and any(word in err.decode() for word in _OFFLINE):
        pytest.skip(f"npx could not fetch {INSPECTOR}: {err.decode().strip().splitlines()[-1]}")
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("npx") is None,
                    reason="npx (npm) is not installed: the Inspector runs on it")
async def test_the_mcp_inspector_cli_lists_the_tools_and_calls_search_memory(
        mcp_app: App, tmp_path: Path) -> None:
    """`npx @modelcontextprotocol/inspector --cli recalld mcp …` lists the tools, and its
    tools/call of search_memory returns the sentence said in a chat."""
    await said(mcp_app, "My favourite programming language is Rust.")
    listed = await _inspector(tmp_path, mcp_app, "--method", "tools/list")
    assert isinstance(listed, dict)
    assert {"search_memory", "remember", "forget"} <= {t["name"] for t in listed["tools"]}
    called = await _inspector(tmp_path, mcp_app, "--method", "tools/call", "--tool-name",
                              "search_memory", "--tool-arg", "query=favourite programming language")
    assert isinstance(called, dict) and not called.get("isError")
    assert ("My favourite programming language is Rust."
            in called["structuredContent"]["excerpts"][0]["text"])
