"""Retrieval on PostgreSQL equals SQLite's on the sample dataset (issue 21: within 0.01 R@10
in every mode), with the tests' deterministic embedder so that it runs in seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.recall import MODES, load_dataset, run_benchmark
from bench.recall_pg import run_postgres_benchmark
from tests.memory.conftest import FakeEmbedder

SAMPLE = Path(__file__).resolve().parents[2] / "bench" / "data" / "sample.json"


@pytest.mark.parametrize("granularity", ["chunk", "turn"])
async def test_recall_at_10_matches_sqlite_in_every_mode(pg_dsn: str, granularity: str) -> None:
    """Both backends index the sample through their own indexer and answer every question in
    every mode; R@10 differs by at most 0.01 per mode, and no mode falls back."""
    dataset = load_dataset(SAMPLE)
    common: dict[str, Any] = {"dataset_name": "sample", "embedder_name": "fake",
                              "granularity": granularity, "k": 10, "rrf_k": 60, "candidates": 50,
                              "base_config": None}
    sqlite = await run_benchmark(dataset, embedder=FakeEmbedder(), **common)
    postgres = await run_postgres_benchmark(dataset, dsn=pg_dsn, embedder=FakeEmbedder(),
                                            **common)
    for mode in MODES:
        assert postgres.ran_as[mode] == {mode: len(dataset.questions)}
        ours = postgres.report["modes"][mode]["overall"]["recall@10"]
        theirs = sqlite.report["modes"][mode]["overall"]["recall@10"]
        assert abs(ours - theirs) <= 0.01, (mode, ours, theirs)
