"""`recalld mcp` without the `mcp` package says the exact command that installs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# The SDK is installed for the suite; the child hides it (a None entry makes `import mcp` fail).
_HIDDEN = ("import sys; sys.modules['mcp'] = None; from gateway.cli.main import main; "
           "sys.exit(main(sys.argv[1:]))")


def test_missing_sdk_names_the_command_to_run(tmp_path: Path) -> None:
    """Without the SDK, `recalld mcp` exits 2 with one line ending in the pip command of the
    interpreter that runs it, in this checkout (an editable install)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    out = subprocess.run([sys.executable, "-c", _HIDDEN, "--data-dir", str(tmp_path), "mcp"],
                         capture_output=True, text=True, timeout=60, env=env,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 2 and out.stdout == ""
    checkout = Path(__file__).resolve().parents[2]
    assert out.stderr.strip().endswith(
        f"; run: cd {checkout} && {sys.executable} -m pip install -e '.[mcp]'"), \
        out.stderr
