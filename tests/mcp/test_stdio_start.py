"""`recalld mcp` starts without the daemon's own stack: what a client waits for at every spawn.

No timing is asserted (a test must never time the machine): the child runs the real command up
to the point where the stdio server would start, and says which heavy modules it had imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcp.server.mcpserver",
                    reason="the mcp extra is not installed (pip install -e '.[mcp]')")

# In the child: `recalld mcp` as main() runs it, with the stdio loop replaced by building the
# server (the tool set, the SDK) and printing which of the modules it must not need are loaded.
_PROBE = """
import sys
import gateway.mcp.stdio as stdio
from gateway.mcp.tools import build_server

async def ready(link, *, version):
    build_server(link, version=version)
    heavy = sorted(m for m in ("openai", "gateway.app", "gateway.chat", "gateway.transport",
                               "onnxruntime")
                   if m in sys.modules)
    print("imported:", ",".join(heavy), "version:", version)

stdio.serve_stdio = ready
from gateway.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_mcp_stdio_start_imports_no_chat_stack(tmp_path: Path) -> None:
    """The stdio server is built with neither the openai SDK nor gateway.app / gateway.chat /
    the transport loaded (they cost most of a start), and with the package's version."""
    token = tmp_path / "agent.token"
    token.write_text("t" * 43 + "\n")
    token.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    out = subprocess.run([sys.executable, "-c", _PROBE, "--data-dir", str(tmp_path / "data"), "mcp",
                          "--url", "ws://127.0.0.1:9/", "--token-file", str(token)],
                         capture_output=True, text=True, timeout=120, env=env,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("imported:  version:"), line
    assert not line.endswith("version: "), line
