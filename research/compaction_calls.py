"""How many model calls compaction makes per 100 messages of a chat, with the defaults.

Starts a real gateway in this process (port 0) whose chat model is the loopback fake OpenAI
server, sends ``--turns`` user messages into one session through ``chat.send`` (each answered:
two transcript messages per turn), waits for compaction's background jobs after each reply,
and counts the summary requests the fake received (``FakeOpenAI.compaction_requests``) and
the gateway's own count (``Compactor.calls``). Prints the calls per 100 messages and the
summary's coverage at the end.

    .venv/bin/python -m research.compaction_calls --turns 50
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

from gateway.client import Client
from testkit.fake_openai import FakeOpenAI
from testkit.gateway import TOKEN, make_config, running_gateway


async def measure(turns: int, every: int | None) -> dict[str, float]:
    fake = await FakeOpenAI().start()
    chat: dict[str, object] = {} if every is None else {"compaction_every": every}
    try:
        with tempfile.TemporaryDirectory(prefix="recalld-compaction-") as tmp:
            config = make_config(Path(tmp) / "data", chat=chat, llm={
                "base_url": fake.base_url, "api_key": "sk-test", "model": "fake-model",
                "max_retries": 0})
            async with running_gateway(config) as app, Client.connect(app.url, TOKEN) as c:
                key = (await c.call("sessions.create"))["sessionKey"]
                for i in range(turns):
                    run_id = (await c.call("chat.send", {
                        "sessionKey": key, "message": f"message number {i}"}))["runId"]
                    while True:
                        event = await c.next_event()
                        if event.get("params", {}).get("runId") == run_id and \
                                event.get("method") in ("chat.final", "chat.error", "chat.aborted"):
                            break
                    await app.runs.compactor.idle()
                session = await c.call("sessions.get", {"sessionKey": key})
                summary = session.get("summary") or {}
                messages = 2 * turns
                return {"messages": messages, "calls": len(fake.compaction_requests),
                        "gateway_calls": app.runs.compactor.calls,
                        "per_100": 100 * len(fake.compaction_requests) / messages,
                        "covered": float(summary.get("messages", 0))}
    finally:
        await fake.close()


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m research.compaction_calls",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--every", type=int, default=None,
                        help="chat.compaction_every (default: the default)")
    args = parser.parse_args()
    r = asyncio.run(measure(args.turns, args.every))
    print(f"{r['messages']:.0f} messages: {r['calls']:.0f} summary calls (gateway counted"
          f" {r['gateway_calls']:.0f}), {r['per_100']:.1f} per 100 messages; the last summary"
          f" covers {r['covered']:.0f} messages")
    return 0


if __name__ == "__main__":
    sys.exit(main())
