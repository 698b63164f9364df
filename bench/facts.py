"""Remembered facts: de-duplication quality, and the latency the facts add to a chat run.

Dedup: every labelled pair of ``bench/data/fact_pairs.json`` goes through the real store —
fact ``a`` added, then fact ``b`` for the same (fresh) user — and the pair counts as judged
duplicate when ``b`` did not become a new fact (exact tier or the cosine tier at
``memory.facts_dedup_threshold``). Printed: precision and recall of "duplicate" at the
configured threshold, and the same over a threshold sweep from the pairs' cosines.

Latency: two gateways in this process, the same local embedder, one with ``memory.facts =
"tool"`` and 50 remembered facts, one with ``"off"``; both stream from the loopback fake model
(no tool calls); chat.recall is on in both unless ``--recall off``. Runs alternate between them;
each run is timed from ``chat.send`` to ``chat.final`` at the client. Printed: p50 of each and of
the per-round difference.

    .venv/bin/python -m bench.facts                 # both parts
    .venv/bin/python -m bench.facts --only dedup    # or --only latency; --runs N
    .venv/bin/python -m bench.facts --only latency --facts block   # the "on" gateway in block mode
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from gateway.client import Client
from gateway.logs import configure_logging
from memory import MemoryConfig, MemoryService, select_embedder
from memory.embedders.embeddings import EmbeddingPipeline
from memory.facts.rules import cosine, text_hash
from testkit.fake_openai import FakeOpenAI
from testkit.gateway import TOKEN, make_config, running_gateway

DATA = Path(__file__).parent / "data" / "fact_pairs.json"


def _pr(pairs: list[dict[str, Any]], judged: list[bool]) -> tuple[float, float, int, int, int]:
    tp = sum(1 for p, j in zip(pairs, judged, strict=True) if j and p["duplicate"])
    fp = sum(1 for p, j in zip(pairs, judged, strict=True) if j and not p["duplicate"])
    fn = sum(1 for p, j in zip(pairs, judged, strict=True) if not j and p["duplicate"])
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    return precision, recall, tp, fp, fn


async def dedup() -> None:
    pairs = orjson.loads(DATA.read_bytes())["pairs"]
    config = MemoryConfig(embedder="local", watch=False)
    embedder, reason = select_embedder(config)
    if embedder is None:
        raise SystemExit(f"the local embedder is not available: {reason}")
    print(f"dedup: {len(pairs)} pairs ({sum(p['duplicate'] for p in pairs)} duplicate), "
          f"embedder {embedder.model_id}, threshold {config.facts_dedup_threshold}")
    with tempfile.TemporaryDirectory() as tmp:
        async with MemoryService(Path(tmp), config, embedder) as svc:
            judged: list[bool] = []
            started = time.perf_counter()
            for i, pair in enumerate(pairs):
                user = f"pair{i}"
                await svc.facts.add(user, pair["a"], source="user")
                change = await svc.facts.add(user, pair["b"], source="user")
                judged.append(change.action != "added")
            elapsed = time.perf_counter() - started
    p, r, tp, fp, fn = _pr(pairs, judged)
    for pair, j in zip(pairs, judged, strict=True):
        if j != pair["duplicate"]:
            print(f"  {'false merge' if j else 'missed dup '}: {pair['a']!r} / {pair['b']!r}")
    print(f"  store at {config.facts_dedup_threshold}: precision {p:.3f}  recall {r:.3f}  "
          f"(tp {tp}, fp {fp}, fn {fn}; {elapsed / len(pairs) * 1000:.1f} ms per pair, two saves)")
    pipeline = EmbeddingPipeline.from_config(embedder, config)
    texts = sorted({t for p in pairs for t in (p["a"], p["b"])})
    vectors = dict(zip(texts, await pipeline.embed_batch(texts), strict=True))
    sims = [cosine(vectors[p["a"]], vectors[p["b"]]) for p in pairs]
    exact = [text_hash(p["a"]) == text_hash(p["b"]) for p in pairs]
    print("  sweep (exact tier or cosine ≥ t):")
    for t in (0.80, 0.84, 0.86, 0.88, 0.90, 0.92, 0.94, 0.96):
        p, r, tp, fp, fn = _pr(pairs, [e or s >= t for e, s in zip(exact, sims, strict=True)])
        print(f"    t={t:.2f}  precision {p:.3f}  recall {r:.3f}  (tp {tp}, fp {fp}, fn {fn})")
    dup = [s for s, p in zip(sims, pairs, strict=True) if p["duplicate"]]
    non = [s for s, p in zip(sims, pairs, strict=True) if not p["duplicate"]]
    print(f"  cosine median: duplicates {statistics.median(dup):.3f}, non-duplicates "
          f"{statistics.median(non):.3f}")
    close = getattr(embedder, "aclose", None)
    if close is not None:
        await close()


async def _timed_run(c: Client, key: str, text: str) -> float:
    started = time.perf_counter()
    run_id = (await c.call("chat.send", {"sessionKey": key, "message": text}))["runId"]
    while True:
        event = await c.next_event()
        params = event.get("params", {})
        if params.get("runId") == run_id and event["method"] in ("chat.final", "chat.error",
                                                                 "chat.aborted"):
            if event["method"] != "chat.final":
                raise RuntimeError(f"run ended with {event['method']}: {params}")
            return time.perf_counter() - started


async def latency(runs: int, recall: bool, mode: str = "tool") -> None:
    async with FakeOpenAI() as fake:
        fake.configure(reply="Sure, here is a short answer for you.")
        with tempfile.TemporaryDirectory() as tmp:
            def config(name: str, facts: str) -> Any:
                return make_config(Path(tmp) / name,
                                   llm={"base_url": fake.base_url, "api_key": "sk-bench",
                                        "model": "fake-model", "max_retries": 0},
                                   memory={"embedder": "local", "facts": facts},
                                   chat={"recall": recall})

            async with running_gateway(config("on", mode)) as on_app, \
                    running_gateway(config("off", "off")) as off_app:
                async with Client.connect(on_app.url, TOKEN) as on, \
                        Client.connect(off_app.url, TOKEN) as off:
                    for i in range(50):
                        await on.call("memory.facts.add",
                                      {"text": f"Fact {i}: I like hobby number {i} and "
                                               f"city {i * 7}."})
                    keys = {c: (await c.call("sessions.create"))["sessionKey"] for c in (on, off)}
                    # warm-up: model loaded, connections open, something indexed
                    for c in (on, off):
                        for _ in range(3):
                            await _timed_run(c, keys[c], "warm up")
                    if recall:
                        # Recall embeds the message only once the vector index is ready; wait for
                        # it so the "on" side can share that query vector as it would in use.
                        for c in (on, off):
                            async with asyncio.timeout(60):
                                while not (await c.call("memory.status"))["vectorSearch"]["ready"]:
                                    await asyncio.sleep(0.2)
                    samples: dict[str, list[float]] = {"on": [], "off": []}
                    diffs: list[float] = []
                    for i in range(runs):
                        order = ([("on", on), ("off", off)] if i % 2 == 0
                                 else [("off", off), ("on", on)])
                        got = {}
                        for name, c in order:
                            # A fresh session each round keeps history length (and prompt size)
                            # equal.
                            key = (await c.call("sessions.create"))["sessionKey"]
                            got[name] = await _timed_run(c, key,
                                                         f"What do you remember about hobby {i}?")
                            samples[name].append(got[name])
                        diffs.append(got["on"] - got["off"])
    on_p50 = statistics.median(samples["on"]) * 1000
    off_p50 = statistics.median(samples["off"]) * 1000
    print(f"latency: {runs} runs each, chat.send → chat.final, fake model, local embedder, "
          f"50 facts, recall {'on' if recall else 'off'}, facts on = {mode!r}")
    print(f"  facts on  p50 {on_p50:.1f} ms")
    print(f"  facts off p50 {off_p50:.1f} ms")
    print(f"  added p50 (per-round difference) {statistics.median(diffs) * 1000:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("dedup", "latency"))
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--recall", choices=("on", "off"), default="on",
                        help="chat.recall in both gateways (on: the default a user gets)")
    parser.add_argument("--facts", choices=("tool", "block"), default="tool",
                        help="memory.facts of the 'on' gateway (the other has 'off')")
    args = parser.parse_args()
    configure_logging("warning", "console")  # the figures are the output, not the log
    if args.only in (None, "dedup"):
        asyncio.run(dedup())
    if args.only in (None, "latency"):
        asyncio.run(latency(args.runs, args.recall == "on", args.facts))


if __name__ == "__main__":
    main()
