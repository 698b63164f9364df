"""Does onnxruntime's CPU memory arena make the local embedder faster or larger?

``.venv/bin/python -m research.embedder_arena [off|on] [--texts N] [--rounds R]`` embeds N
generated texts of 5–450 words (fixed seed) in batches of 16, R times, with the product's
session options (arena as given, memory pattern off) and prints each round's texts/s, the
process's resident memory and its peak. Run each mode in its own process (the peak is the
process's). The answer is in the docstring of ``memory/embedders/local_embedder.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import resource
import time
from pathlib import Path
from typing import Any

import memory.embedders.local_embedder as local

WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at "
         "which but have an they you were her she there been one all we their has would when if "
         "so no will can more out up what about who into do time only").split()


def _resident_mib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return 0


def _with_arena(arena: bool) -> None:
    """Make ``local.onnx_session`` build its session with the CPU arena ``arena``."""
    import onnxruntime as ort

    checked = local.onnx_session

    def session(path: Path, sha256: str, threads: int, *, need: str) -> Any:
        checked(path, sha256, threads, need=need)  # the file's checks, as the product does them
        options = ort.SessionOptions()
        options.enable_cpu_mem_arena = arena
        options.enable_mem_pattern = False
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        return ort.InferenceSession(str(path), sess_options=options,
                                    providers=["CPUExecutionProvider"])

    local.onnx_session = session


async def main(args: argparse.Namespace) -> None:
    _with_arena(args.mode == "on")
    rng = random.Random(1)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 450)))
             for _ in range(args.texts)]
    embedder = local.LocalEmbedder()
    await embedder.embed(texts[:4])  # load the model outside the timed rounds
    for r in range(args.rounds):
        started = time.perf_counter()
        for i in range(0, len(texts), 16):
            await embedder.embed(texts[i:i + 16])
        took = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        print(f"arena {args.mode} round {r}: {len(texts) / took:.1f} texts/s, "
              f"resident {_resident_mib()} MiB, peak {peak} MiB", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("off", "on"))
    parser.add_argument("--texts", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=6)
    asyncio.run(main(parser.parse_args()))
