"""``python -m research.importrate [--messages 10000] [--embedders none,local]``:
import + index rate.

Writes a ChatGPT-shaped ``conversations.json`` of real chat text (RealMem's sessions,
``bench/data/realmem_bench.json``, else ``bench/data/sample.json`` repeated),
then runs ``recalld import`` on it in a fresh data dir per embedder, as a user would (its own
process), timing the whole command and reading its two summary lines. Prints a table and
writes ``bench/results/import.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.realdist import SOURCES

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"


def chatgpt_export(messages: int) -> tuple[list[dict[str, Any]], str]:
    source = next(p for p in SOURCES if p.exists())
    data = json.loads(source.read_text())
    sessions = [(c["id"], s) for c in data["conversations"] for s in c["sessions"]]
    out: list[dict[str, Any]] = []
    written = 0
    rounds = 0
    while written < messages:
        for conv_id, s in sessions:
            if written >= messages:
                break
            start = datetime.fromisoformat(s["date"]).timestamp() if "date" in s else 1.7e9
            mapping: dict[str, Any] = {}
            parent = None
            first = s["turns"][0]["speaker"] if s["turns"] else None
            for i, turn in enumerate(s["turns"][:messages - written]):
                node = f"{conv_id}-{s['id']}-{rounds}-{i}"
                mapping[node] = {"id": node, "parent": parent, "children": [], "message": {
                    "id": node,
                    "author": {"role": "user" if turn["speaker"] == first else "assistant"},
                    "create_time": start + 60 * i, "metadata": {},
                    "content": {"content_type": "text", "parts": [turn["text"]]}}}
                if parent is not None:
                    mapping[parent]["children"].append(node)
                parent = node
            written += len(mapping)
            out.append({"title": f"{conv_id} {s['id']}", "create_time": start, "mapping": mapping,
                        "conversation_id": f"{conv_id}-{s['id']}-{rounds}", "current_node": parent})
        rounds += 1
    return out, source.name


def run_import(export: Path, embedder: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    env["RECALLD_MEMORY_EMBEDDER"] = embedder
    with tempfile.TemporaryDirectory(prefix="recalld-import-") as tmp:
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "gateway", "--data-dir", tmp, "import",
                               str(export), "--user", "bench"],
                              capture_output=True, text=True, env=env, check=False)
        took = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    imported = re.search(r"(\d+) messages written in ([\d.]+) s", proc.stdout)
    indexed = re.search(r"indexed: (\d+) chunks written, (\d+) embedded .*?, (\d+) pending, "
                        r"([\d.]+) s", proc.stdout)
    assert imported and indexed, proc.stdout
    messages, write_s = int(imported[1]), float(imported[2])
    chunks, embedded, pending, index_s = (int(indexed[1]), int(indexed[2]), int(indexed[3]),
                                          float(indexed[4]))
    return {"embedder": embedder, "messages": messages, "writeS": write_s, "chunks": chunks,
            "embedded": embedded, "pending": pending, "indexS": index_s, "commandS": took,
            "messagesPerS": messages / took,
            "stdout": proc.stdout.strip()}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m research.importrate", description=__doc__)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--embedders", default="none,local")
    args = parser.parse_args()
    conversations, source = chatgpt_export(args.messages)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        export = Path(tmp) / "conversations.json"
        export.write_text(json.dumps(conversations))
        for embedder in args.embedders.split(","):
            print(f"· recalld import, embedder {embedder} …", flush=True)
            rows.append(run_import(export, embedder))
    print(f"\n{args.messages:,} messages of {source} in {len(conversations):,} ChatGPT "
          f"conversations; load average {os.getloadavg()[0]:.1f}")
    print(f"{'embedder':<9} {'command s':>9} {'msgs/s':>8} {'write s':>8} {'index s':>8} "
          f"{'chunks':>7} {'embedded':>8}")
    for r in rows:
        print(f"{r['embedder']:<9} {r['commandS']:>9.1f} {r['messagesPerS']:>8.0f} "
              f"{r['writeS']:>8.1f} {r['indexS']:>8.1f} {r['chunks']:>7} {r['embedded']:>8}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "import.json").write_text(json.dumps({"source": source,
                                                     "conversations": len(conversations),
                                                     "loadAverage": os.getloadavg(),
                                                     "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
