"""``python -m bench.profiled OUT PYTHON -m gateway ARGS…``: one gateway node under cProfile.

``testkit.gateway.gateway_child(wrapper=…)`` puts this in front of the node's command and
stops it with SIGINT, on which the node stops cleanly and the profile is written to ``OUT``.
Every thread gets its own profiler (the node's blocking work — a PostgreSQL store's calls, the
embedder — runs on worker threads), merged into one file at the end.
"""

from __future__ import annotations

import cProfile
import pstats
import runpy
import sys
import threading
from types import FrameType
from typing import Any

_profiles: list[cProfile.Profile] = []


def _thread_start(frame: FrameType, event: str, arg: Any) -> None:
    # The first profile event of a new thread swaps this hook for the thread's own profiler.
    sys.setprofile(None)
    profile = cProfile.Profile()
    _profiles.append(profile)
    profile.enable()


def main() -> None:
    out, command = sys.argv[1], sys.argv[2:]
    if command[1:3] != ["-m", "gateway"]:
        raise SystemExit("usage: python -m bench.profiled OUT PYTHON -m gateway ARGS…")
    sys.argv = ["gateway", *command[3:]]
    threading.setprofile(_thread_start)
    main_profile = cProfile.Profile()
    main_profile.enable()
    try:
        runpy.run_module("gateway", run_name="__main__", alter_sys=True)
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        main_profile.disable()
        stats = pstats.Stats(main_profile)
        for profile in list(_profiles):
            try:
                stats.add(profile)
            except Exception:  # noqa: BLE001, S112 - a thread still inside its profiler is left out
                continue
        stats.dump_stats(out)


if __name__ == "__main__":
    main()
