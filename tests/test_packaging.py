"""Item 18 of issue 10: `make serve` installs the runtime only, and pyproject.toml's license
is the SPDX string setuptools wants (no deprecation warning on every install)."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _dry_run(target: str, tmp_path: Path) -> str:
    """The commands `make TARGET` would run in a fresh checkout (no .venv yet), not run."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, checkout / name)
    out = subprocess.run(["make", "-n", target], cwd=checkout, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_make_serve_installs_runtime_extras_only(tmp_path: Path) -> None:
    """`make serve` on a fresh checkout installs `.[local]` and never the dev (test) extra."""
    commands = _dry_run("serve", tmp_path)
    installs = [line for line in commands.splitlines() if "pip install" in line and "-e" in line]
    assert installs and all("dev" not in line for line in installs), commands
    assert any("'.[local]'" in line for line in installs), commands
    assert "recalld serve" in commands


def test_make_test_installs_the_test_tools(tmp_path: Path) -> None:
    """`make test` on a fresh checkout installs the dev extra too (pytest, mypy)."""
    commands = _dry_run("test", tmp_path)
    assert any("pip install" in line and "dev" in line for line in commands.splitlines()), commands


def test_license_is_an_spdx_string() -> None:
    """project.license is a plain SPDX string (a TOML table is deprecated by setuptools >= 77,
    which printed a warning on every install), and the build requires a setuptools that reads it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in project["build-system"]["requires"]
