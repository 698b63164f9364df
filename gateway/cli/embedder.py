"""The embedder a CLI command that works on the index uses beside a running daemon.

The index records one embedder identity; opening it with another starts a rebuild of every
vector. A command run from another shell (``recalld import``, ``recalld memory …``) may well
pick another embedder than the daemon's — an API key set in the daemon's environment only, say
— and would then switch the index to its own model while the daemon switches it back: every
chunk embedded twice. So beside a daemon that published its embedder (``daemon.json``,
gateway.runtime), a command embeds only with the same one; otherwise it embeds nothing and
leaves the new chunks pending for the daemon, saying so once. Without a daemon the command's
own configuration decides, as the daemon's would.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys

from gateway.config import Config
from gateway.runtime import read_runtime_embedder
from memory import Embedder, probe_auto_embedder, select_embedder

__all__ = ["index_embedder"]


async def index_embedder(config: Config) -> tuple[Embedder | None, str] | None:
    """The (embedder, reason) a CLI command opens the index with, or None: pick as the daemon
    does (no daemon serves this data dir)."""
    from gateway.app import effective_memory_config  # the daemon's own reading of the settings

    served, identity = read_runtime_embedder(config.data_dir)
    if not served:
        return None
    cfg = effective_memory_config(config)
    picked, why = await asyncio.to_thread(select_embedder, dataclasses.replace(cfg, watch=False))
    chosen, reason = await probe_auto_embedder(cfg, picked, why)
    mine = (chosen.provider, chosen.model_id, chosen.endpoint_hash) if chosen is not None else None
    if mine == identity:
        return chosen, reason
    if chosen is not None:
        aclose = getattr(chosen, "aclose", None)
        if aclose is not None:
            await aclose()
    theirs = f"{identity[0]} {identity[1]}" if identity else "no embedder"
    ours = f"{mine[0]} {mine[1]}" if mine else "none"
    print(f"recalld: the daemon serving {config.data_dir} embeds with {theirs}, this command would "
          f"use {ours}: it embeds nothing and leaves new chunks to the daemon (put the same [llm] "
          "and [memory] settings in config.toml so that every command agrees)", file=sys.stderr)
    return None, f"the daemon serving this data dir embeds with {theirs}"
