"""The dumped corpora research.splade and research.colbert score: legs, texts, vectors, index.

Each dataset × granularity (× conversation subset) is indexed and dumped once by
:func:`research.fusion_cv.dump` (the real store and indexer, keyword-only; bge-small vectors
from the harness's embedding cache, missing ones embedded) into ``bench/.cache/sparse/NAME/``:
``legs.json`` (both legs' top 100 per question, each chunk's turn ids, the chunk and question
texts), ``dense.npz`` (unit chunk and query vectors, chunk ids) and ``memory.db`` (the keyword
index, for queries the dump did not run). Reruns read the files and cost no model time.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from research.fusion_cv import CACHE, dump

_REPO = Path(__file__).resolve().parent.parent
ROOT = _REPO / "bench" / ".cache" / "sparse"


@dataclass(frozen=True, slots=True)
class Corpus:
    """One dumped dataset × granularity."""

    name: str
    folder: Path
    legs: dict[str, Any]        # fusion_cv's dump plus "texts" (by chunk id) and "asked"
    matrix: Any                 # unit chunk vectors, rows in ``ids`` order
    queries: Any                # unit query vectors, one per question
    ids: Any                    # chunk ids of ``matrix``'s rows

    @property
    def db(self) -> Path:
        return self.folder / "memory.db"


def run_name(run: str, subsets: dict[str, list[str]]) -> tuple[Path, str, list[str] | None, str]:
    """``DATASET:GRANULARITY`` → (path, granularity, subset, name)."""
    path_text, _, granularity = run.rpartition(":")
    path = Path(path_text)
    subset = subsets.get(path.stem)
    name = f"{path.stem}{'-' + str(len(subset)) if subset else ''}-{granularity}"
    return path, granularity, subset, name


def load(run: str, subsets: dict[str, list[str]], root: Path = ROOT, cache: Path = CACHE) -> Corpus:
    """The dump of ``run``, made first when missing."""
    import numpy as np

    path, granularity, subset, name = run_name(run, subsets)
    folder = root / name
    if not (folder / "legs.json").exists():
        print(f"dumping {name} …", file=sys.stderr)
        folder.mkdir(parents=True, exist_ok=True)
        vectors: dict[str, Any] = {}
        legs = asyncio.run(dump(path, granularity, subset, cache, vectors,
                                keep_db=folder / "memory.db"))
        legs["texts"] = {str(int(i)): t for i, t in zip(vectors["ids"], vectors["texts"])}
        legs["asked"] = vectors["asked"]
        legs["users"] = {str(int(i)): u for i, u in zip(vectors["ids"], vectors["users"])}
        legs["user_of"] = vectors["user_of"]
        np.savez(folder / "dense.npz", matrix=vectors["matrix"].astype(np.float32),
                 queries=vectors["queries"].astype(np.float32), ids=vectors["ids"])
        (folder / "legs.json").write_text(json.dumps(legs), encoding="utf-8")
    legs = json.loads((folder / "legs.json").read_text(encoding="utf-8"))
    with np.load(folder / "dense.npz") as z:
        matrix, queries, ids = z["matrix"], z["queries"], z["ids"]
    queries = queries / np.clip(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12, None)
    return Corpus(name, folder, legs, matrix, queries, ids)
