"""``make bench-cluster``'s table (``cluster.md``) and plot (``cluster.png``) from its JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot", "recall_gaps", "write_markdown"]

TOPOS = ("sqlite-1", "pg-1", "pg-2")
MODES = ("keyword", "vector", "hybrid")


def recall_gaps(out: dict[str, Any]) -> dict[str, float]:
    """PostgreSQL's recall@10 minus SQLite's, per granularity and mode (the issue: within 0.01)."""
    recall = out["results"].get("recall", {})
    return {f"{g}/{m}": recall[f"postgres/{g}"][m] - recall[f"sqlite/{g}"][m]
            for g in ("chunk", "turn") if f"sqlite/{g}" in recall and f"postgres/{g}" in recall
            for m in MODES}


def _cell(results: dict[str, Any], topo: str, get: Any) -> str:
    try:
        return str(get(results[topo]))
    except (KeyError, TypeError):
        return "—"


def rows(out: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    r = out["results"]
    table: list[tuple[str, str, str, str]] = []

    def add(label: str, get: Any) -> None:
        if any(_cell(r, t, get) != "—" for t in TOPOS):
            table.append((label, *(_cell(r, t, get) for t in TOPOS)))  # type: ignore[arg-type]

    for key in ("health ping-pong", "health pipelined", "sessions.list pipelined"):
        add(f"RPC {key} (calls/s, 16 connections)", lambda f, k=key: f"{f['rpc'][k]['rate']:,.0f}")
    add("chat fan-out to 100 subscribers: send → last chat.final p50 / p99 (ms)",
        lambda f: f"{f['fanout']['last']['p50']:.0f} / {f['fanout']['last']['p99']:.0f}")
    add("index rate: messages/s, first send → searchable",
        lambda f: f"{f['index']['rate']:.1f} ({f['index']['messages']} msgs)")
    add("index lag: last chat.final → searchable (ms)",
        lambda f: f"{f['index']['lagAfterLastFinalMs']:,.0f}")
    s = r.get("search")
    if s:
        for mode in MODES:
            table.append((f"memory.search {mode} p50 / p99 at {s['chunks']['sqlite']:,} chunks "
                          "(library, ms)",
                          _lat(s["sqlite"]["library"][mode]), _lat(s["postgres"]["library"][mode]),
                          "same database as pg-1"))
        table.append(("vector recall@10 vs exact float scan", f"{s['sqlite']['recall10']:.3f}",
                      f"{s['postgres']['recall10']:.3f}"
                      if s["postgres"].get("recall10") is not None else "—", ""))
        table.append(("restart to first hybrid search (ms)", f"{s['sqlite']['restartMs']:,.0f}",
                      f"{s['postgres']['restartMs']:,.0f}", ""))
        b = s["build"]
        now, pg = b["sqlite"].get("thisRun"), b["postgres"]
        if now and "keywordS" in pg:
            # Both rebuilt keyword-only in this run (the goal: PostgreSQL ≥ 1/3 of SQLite's).
            sq, pq = now["keywordChunks"] / now["keywordS"], pg["keywordChunks"] / pg["keywordS"]
            table.append(("index build keyword-only, this run (chunks/s)", f"{sq:,.0f}",
                          f"{pq:,.0f} ({pq / sq:.2f}× SQLite's)", ""))
        table.append(("bulk index build (chunks/s)",
                      f"{s['chunks']['sqlite'] / b['sqlite']['keyword_s']:,.0f} keyword, "
                      f"{s['chunks']['sqlite'] / b['sqlite']['embed_s']:,.0f} vectors "
                      "(corpus build)",
                      f"{s['chunks']['postgres'] / pg['indexS']:,.0f} vectors from the cache and "
                      "HNSW"
                      if "keywordS" in pg else
                      f"{s['chunks']['postgres'] / pg['indexS']:,.0f} (chunks, postings, "
                      "vectors, HNSW)", ""))
    rec = r.get("recall")
    if rec:
        for g in ("chunk", "turn"):
            if f"sqlite/{g}" not in rec:
                continue
            table.append((f"recall@10 sample.json, {g} (keyword / vector / hybrid)",
                          " / ".join(f"{rec[f'sqlite/{g}'][m]:.3f}" for m in MODES),
                          " / ".join(f"{rec[f'postgres/{g}'][m]:.3f}" for m in MODES),
                          "same database as pg-1"))
    return table


def _lat(s: dict[str, float]) -> str:
    return f"{s['p50']:.1f} / {s['p99']:.1f}"


def cpu_rows(out: dict[str, Any]) -> list[str]:
    lines = ["| topology | section | wall s | nodes CPU s | PostgreSQL CPU s | driver CPU s | "
             "model CPU s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for topo in TOPOS:
        for section, c in out["results"].get(topo, {}).get("cpu", {}).items():
            lines.append(f"| {topo} | {section} | {c['wallS']:.1f} | {c['nodes']:.1f} | "
                         f"{c['postgres']:.1f} | {c['driver']:.1f} | {c['model']:.1f} |")
    return lines if len(lines) > 2 else []


def profile_lines(out: dict[str, Any]) -> list[str]:
    prof = out["results"].get("profile") or {}
    lines: list[str] = []
    for node, p in prof.items():
        busy = p.get("busyS") or p["totalS"]
        lines.append(f"\n{node}: {p['totalS']:.1f} s profiled over all threads, {busy:.1f} s of it "
                     "not waiting; by area (share of the time not waiting):\n")
        lines.append("| area | seconds | share |")
        lines.append("| --- | --- | --- |")
        for area, secs in list(p["areas"].items())[:16]:
            share = "—" if area.startswith("wait:") else f"{secs / busy:.0%}"
            lines.append(f"| {area} | {secs:.2f} | {share} |")
        lines.append("\nbusiest functions (own time, waits left out):\n")
        lines.append("| seconds | calls | function |")
        lines.append("| --- | --- | --- |")
        for row in p["top"][:10]:
            lines.append(f"| {row['tottimeS']:.2f} | {row['calls']:,} | `{row['where']}` |")
    return lines


def write_markdown(out: dict[str, Any], path: Path) -> str:
    table = ["| figure | sqlite-1 | pg-1 | pg-2 |", "| --- | --- | --- | --- |"]
    table += [f"| {' | '.join(row)} |" for row in rows(out)]
    text = "\n".join(table)
    gaps = recall_gaps(out)
    m = out["machine"]
    doc = [f"# bench-cluster, {out['at'][:16]} UTC", "",
           f"{m['cpuCount']} CPUs ({m['cpu']}), load average {out['loadAverage'][0]:.1f} at the "
           f"end, {out['seconds']:.0f} s; {'quick' if out['quick'] else 'full'} sizes "
           f"{out['sizes']}; sections {', '.join(out['sections'])}. Nodes, PostgreSQL, "
           "the fake model and the driver all share these CPUs.",
           "", text, ""]
    for i, part in enumerate(out.get("mergedFrom", [])):
        doc.insert(-3, f"{'Measured' if i == 0 else 'Then replaced'}: "
                       f"{', '.join(part['sections'])} by the run at {part['at'][:16]} UTC"
                       + (f" (load average {part['loadAverage'][0]:.1f} at its end)"
                          if "loadAverage" in part else "")
                       + ".")
    if gaps:
        worst = max(gaps.values(), key=abs)
        doc += ["Recall@10, PostgreSQL − SQLite per granularity/mode: "
                + ", ".join(f"{k} {v:+.3f}" for k, v in gaps.items())
                + f" (largest |gap| {abs(worst):.3f}; the issue asks ≤ 0.01).", ""]
    cpu = cpu_rows(out)
    if cpu:
        doc += ["CPU seconds per section (user + system, from /proc):", "", *cpu, ""]
    plan = (out["results"].get("search") or {}).get("postgres", {}).get("hybridPlan")
    if plan:
        doc += ["EXPLAIN (ANALYZE, BUFFERS) of one hybrid search on PostgreSQL:", "", "```", *plan,
                "```", ""]
    prof = profile_lines(out)
    if prof:
        doc += ["cProfile of the two pg-2 nodes under the same load:", *prof, ""]
    path.write_text("\n".join(doc) + "\n")
    return text


def plot(out: dict[str, Any], path: Path) -> bool:
    """Grouped bars per figure; False when matplotlib (the ``bench`` extra) is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    r = out["results"]
    topos = [t for t in TOPOS if t in r]
    colors = {"sqlite-1": "tab:blue", "pg-1": "tab:orange", "pg-2": "tab:green"}
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.4))
    ax = axes[0]
    keys = [k for k in ("health ping-pong", "health pipelined", "sessions.list pipelined")
            if all("rpc" in r[t] for t in topos)]
    for i, t in enumerate(topos):
        ax.bar([j + i * 0.27 for j in range(len(keys))], [r[t]["rpc"][k]["rate"] for k in keys],
               0.27, label=t, color=colors[t])
    ax.set_xticks([j + 0.27 for j in range(len(keys))], [k.replace(" ", "\n", 1) for k in keys],
                  fontsize=8)
    ax.set(title="RPC throughput (calls/s)")
    ax.legend(fontsize=8)
    ax = axes[1]
    fan = [t for t in topos if "fanout" in r[t]]
    ax.bar([t for t in fan], [r[t]["fanout"]["last"]["p50"] for t in fan],
           color=[colors[t] for t in fan], label="p50")
    ax.scatter(fan, [r[t]["fanout"]["last"]["p99"] for t in fan], color="black", marker="_", s=300,
               label="p99")
    ax.set(title="fan-out: send → 100th chat.final (ms)")
    ax.legend(fontsize=8)
    ax = axes[2]
    idx = [t for t in topos if "index" in r[t]]
    ax.bar(idx, [r[t]["index"]["rate"] for t in idx], color=[colors[t] for t in idx])
    ax.set(title="index rate: messages/s to searchable")
    ax = axes[3]
    s = r.get("search")
    if s:
        for i, (backend, color) in enumerate((("sqlite", "tab:blue"), ("postgres", "tab:orange"))):
            lib = s[backend]["library"]
            xs = [j + i * 0.4 for j in range(len(MODES))]
            ax.bar(xs, [lib[m]["p50"] for m in MODES], 0.4, color=color, label=f"{backend} p50")
            ax.scatter(xs, [lib[m]["p99"] for m in MODES], color="black", marker="_", s=200)
        ax.set_xticks([j + 0.2 for j in range(len(MODES))], list(MODES))
        ax.set(title=f"memory.search at {s['chunks']['sqlite']:,} chunks (ms; − p99)")
        ax.legend(fontsize=8)
    for a in axes:
        a.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return True


def merge(full: dict[str, Any], partial: dict[str, Any]) -> dict[str, Any]:
    """``full`` with the sections ``partial`` measured replaced by its figures (a rerun of some
    sections folded into a full run); the merged file says which run each section is from."""
    topo_sections = {"rpc", "fanout", "index"} & set(partial["sections"])
    merged = {**full, "results": dict(full["results"])}
    for topo in TOPOS:
        if topo in partial["results"]:
            kept = {k: v for k, v in full["results"].get(topo, {}).items()
                    if k not in topo_sections | {"cpu"}}
            merged["results"][topo] = {**kept, **partial["results"][topo]}
    for key in ("profile", "recall", "search"):
        if key in partial["sections"] and key in partial["results"]:
            merged["results"][key] = partial["results"][key]
    merged["mergedFrom"] = [*full.get("mergedFrom",
                                      [{"at": full["at"], "sections": full["sections"]}]),
                            {"at": partial["at"], "sections": partial["sections"],
                             "loadAverage": partial["loadAverage"], "sizes": partial["sizes"]}]
    return merged


def main() -> None:
    """``python -m bench.clusterreport RESULTS.json [--merge PARTIAL.json]``: rewrite the .md and
    .png beside RESULTS.json (e.g. with another interpreter that has matplotlib), after folding
    a rerun of some sections into it."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m bench.clusterreport")
    parser.add_argument("results", type=Path)
    parser.add_argument("--merge", type=Path, default=None, metavar="PARTIAL")
    args = parser.parse_args()
    out = json.loads(args.results.read_text())
    if args.merge is not None:
        out = merge(out, json.loads(args.merge.read_text()))
        args.results.write_text(json.dumps(out, indent=2, default=str))
    print(write_markdown(out, args.results.with_suffix(".md")))
    print("plot:", plot(out, args.results.with_suffix(".png")))


if __name__ == "__main__":
    main()
