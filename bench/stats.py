"""Figures, percentiles, the printed table and machine info shared by the benchmarks."""

from __future__ import annotations

import os
import platform
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

__all__ = ["Figure", "machine_info", "pct", "print_table", "summary_ms"]


@dataclass
class Figure:
    """One measured number and, when it has one, its target (``ok`` None: no target)."""

    section: str
    name: str
    value: float
    unit: str
    target: str = ""
    ok: bool | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank on sorted values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


def summary_ms(samples_s: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples_s]
    return {"p50": pct(ms, 50), "p99": pct(ms, 99),
            "mean": statistics.fmean(ms) if ms else float("nan"), "n": len(ms)}


def _fmt(value: float) -> str:
    if value != value:  # NaN
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def print_table(figures: Sequence[Figure]) -> None:
    rows = [("section", "figure", "value", "target", "")]
    for f in figures:
        mark = "" if f.ok is None else ("ok" if f.ok else "MISS")
        rows.append((f.section, f.name, f"{_fmt(f.value)} {f.unit}".strip(), f.target, mark))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for n, r in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    notes = [f for f in figures if f.note]
    if notes:
        print()
        for f in notes:
            print(f"  {f.section} / {f.name}: {f.note}")


def machine_info() -> dict[str, Any]:
    packages: dict[str, str | None] = {}
    for name in ("websockets", "orjson", "apsw", "sqlite-vec", "openai", "structlog", "onnxruntime",
                 "numpy", "tokenizers"):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = None
    try:
        import apsw

        sqlite = apsw.sqlite_lib_version()
    except ImportError:
        sqlite = None
    return {
        "cpuCount": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": _cpu_model(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "sqlite": sqlite,
        "packages": packages,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
