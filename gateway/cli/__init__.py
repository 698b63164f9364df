"""``recalld``: the command line (``serve``, ``token``, ``call``, ``chat``, ``memory``), one
module per command group. The console script is ``gateway.cli:main``."""

from __future__ import annotations

from gateway.cli.main import main

__all__ = ["main"]
