"""What reaches the model's prompt when a conversation is replayed through a real gateway.

    python bench/conversation.py DATASET [--embedder local|none] [--limit N] [--questions N]
                                 [--conversations ID,ID] [--embedding-cache FILE] [--json OUT]

Every conversation of a ``bench/recall.py`` dataset becomes one user of a real gateway started
in this process on port 0 (``testkit.gateway.running_gateway``), its chat model the loopback fake
OpenAI server (``testkit.fake_openai``), which records every request. Two modes, each in a fresh
data dir and gateway:

``separate``
    the conversation's sessions are imported as separate sessions by the product's importer
    (``gateway.cli.importer.import_conversations``, what ``recalld import`` runs) and indexed the
    way ``recalld import`` indexes (``open_memory`` + ``sync_now``) before the gateway starts;
    each question is then asked with ``chat.send`` in a new session (deleted after it, with
    ``sessions.delete``, so no question's session is recalled into a later one).
``one-session``
    for each question, the whole conversation (every session in order) is written as ONE
    session through the running gateway's own session store, with the dataset's timestamps,
    indexed (``sync_now``), the question asked in it with ``chat.send``, and the session
    deleted. A fresh copy per question: a question asked into a session appends itself and its
    reply, which would sit in the next question's history window.

Then the prompt the fake model received is read, and each evidence turn is looked for in three
places: the history window (the non-system messages), a summary section of the system message
(``<conversation_summary>`` … ``</conversation_summary>``; the product writes none yet) and the
recall block (``<recalled_memories>`` … ``</recalled_memories>``). Negatives: each question is
asked a second time as the user of the next conversation (whose index and sessions lack the
question's conversation): what recall puts in that prompt is noise. The figures are described
in ``bench/README.md``, "Conversations through the gateway".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:  # run as `python bench/conversation.py` from anywhere
    sys.path.insert(0, str(_REPO))

from bench.recall import (  # noqa: E402
    NEGATIVE_PAIRING,
    TURN_STEP,
    Conversation,
    Dataset,
    DatasetError,
    Question,
    Turn,
    _keeping,
    _percentiles,
    _Progress,
    _roles,
    _share_cache,
    load_dataset,
    negative_pairs,
    only_conversations,
    user_name,
)
from gateway.app import App  # noqa: E402
from gateway.chat.prompt import RECALL_CLOSE, RECALL_OPEN, message_tokens  # noqa: E402
from gateway.cli.importer import import_conversations  # noqa: E402
from gateway.cli.importer_formats import Conversation as ImportConversation  # noqa: E402
from gateway.cli.importer_formats import Turn as ImportTurn  # noqa: E402
from gateway.client import Client, RpcError  # noqa: E402
from gateway.config import Config  # noqa: E402
from gateway.opening import close_memory, effective_memory_config, open_memory  # noqa: E402
from memory import MemoryService, approx_tokens, select_embedder  # noqa: E402
from memory.retrieval.recall import CUT_MARK  # noqa: E402
from testkit.fake_openai import FakeOpenAI, RecordedRequest, is_title_request  # noqa: E402
from testkit.gateway import make_config, running_gateway  # noqa: E402

__all__ = [
    "MODES", "PLACES", "SUMMARY_CLOSE", "SUMMARY_OPEN", "PromptParts", "evidence_places", "main",
    "recalled_excerpts", "run_conversation_benchmark", "split_prompt", "turn_in_excerpt",
]

MODES = ("one-session", "separate")
PLACES = ("history", "summary", "recall")
# The summary section compaction is to put in the system message; absent today (column 0).
SUMMARY_OPEN = "<conversation_summary>"
SUMMARY_CLOSE = "</conversation_summary>"
IMPORT_FORMAT = "jsonl"   # the importer format name the session keys are derived from
REPLY = "OK."             # the fake model's answer to every question: short, adds nothing
WARMUP = "Let's pick up where we left off."  # one-session: sent before the question (--warmup)
COMPACTION_INSTRUCTION: str | None
try:  # compaction's summary request, recognised by its system message (gateway/chat/compaction.py)
    from gateway.chat.compaction import COMPACTION_INSTRUCTION
except ImportError:  # a product without compaction
    COMPACTION_INSTRUCTION = None
HEAD_CHARS = 40           # a cut excerpt holds a turn whose opening this long survived
                          # (bench/recall.py)
RUN_TIMEOUT_S = 300.0     # one question, send → chat.final (a loaded 2-core machine, RealMem
                          # prompts)
GRANULARITY_NOTE = ("the product always indexes its chunking of each transcript; --granularity "
                    "turn (one transcript per turn) does not apply to a replay of sessions")


# --- reading a prompt (pure) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PromptParts:
    """A recorded prompt cut into the places evidence may reach."""

    history: tuple[str, ...]     # the non-system messages' contents, the question itself left out
    summary: str                 # the summary section's text ("" when there is none)
    excerpts: tuple[str, ...]    # each recalled excerpt, decoded from its JSON string
    tokens: int                  # the whole prompt, counted as the product counts it


def _norm(text: str) -> str:
    return " ".join(text.split())


def _block(text: str, open_tag: str, close_tag: str) -> str | None:
    start = text.find(open_tag)
    if start < 0:
        return None
    end = text.find(close_tag, start)
    return text[start + len(open_tag): end if end >= 0 else len(text)]


def recalled_excerpts(system: str) -> list[str]:
    """The excerpts of the recall block in a system message: each row is ``- [label] "json"``
    (``gateway.chat.prompt.format_recall_block``); the JSON string is the excerpt, quoted."""
    block = _block(system, RECALL_OPEN, RECALL_CLOSE)
    return [] if block is None else _rows(block)


def _rows(block: str) -> list[str]:
    """The decoded ``- [label] "json"`` rows of a fenced memory block
    (``gateway.chat.prompt.fenced``)."""
    out: list[str] = []
    for line in block.splitlines():
        if not line.startswith("- ["):
            continue
        at = line.find('] "')
        if at < 0:
            continue
        try:
            value = json.loads(line[at + 2:])
        except ValueError:
            continue
        if isinstance(value, str):
            out.append(value)
    return out


def split_prompt(messages: Sequence[dict[str, Any]], question: str) -> PromptParts:
    """The recorded request's messages → history, summary, recalled excerpts, tokens."""
    system = "\n\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "system")
    history = [str(m.get("content") or "") for m in messages if m.get("role") != "system"]
    if history and history[-1] == question:
        history.pop()
    block = _block(system, SUMMARY_OPEN, SUMMARY_CLOSE) or ""
    # quoted rows like the other blocks, else the raw text
    summary = "\n".join(_rows(block)) or block
    tokens = sum(message_tokens(str(m.get("content") or "")) for m in messages)
    return PromptParts(tuple(history), summary, tuple(recalled_excerpts(system)), tokens)


def turn_in_excerpt(text: str, excerpt: str) -> bool:
    """Whether a recalled excerpt holds the turn ``text``: the chunker writes each message as
    ``who [ts]: text``, so the turn is ``]: text`` in it; an excerpt that ends inside the turn
    (the budget cut it, ``…``, or the chunk ended in a long message) holds it when its opening
    (``HEAD_CHARS``) survived — the rule ``bench/recall.py`` scores a cut excerpt by."""
    turn, piece = _norm(text), _norm(excerpt)
    if not turn:
        return False
    if f"]: {turn}" in piece:
        return True
    cut = piece.removesuffix(CUT_MARK.strip()).rstrip()
    head = f"]: {turn[:HEAD_CHARS]}"
    at = cut.find(head)
    while at >= 0:
        if turn.startswith(cut[at + 3:]):
            return True
        at = cut.find(head, at + 1)
    return False


def evidence_places(parts: PromptParts, turns: Sequence[Turn]) -> dict[str, set[str]]:
    """Place → the evidence turn ids found there. History: a message whose content is the
    turn's text; summary: the turn's text inside the section; recall: :func:`turn_in_excerpt`."""
    history = {_norm(h) for h in parts.history}
    summary = _norm(parts.summary)
    found: dict[str, set[str]] = {place: set() for place in PLACES}
    for turn in turns:
        text = _norm(turn.text)
        if text in history:
            found["history"].add(turn.id)
        if text and text in summary:
            found["summary"].add(turn.id)
        if any(turn_in_excerpt(turn.text, e) for e in parts.excerpts):
            found["recall"].add(turn.id)
    return found


# --- the replay --------------------------------------------------------------------------------


@dataclass(slots=True)
class Asked:
    """One question asked in one mode: what reached its prompt."""

    question: Question
    negative: bool
    asked_as: str                       # the conversation whose user asked it
    places: dict[str, float]            # place → share of the evidence turns found there
    reached: float                      # share of the evidence turns found anywhere
    all_reached: bool
    prompt_tokens: int
    excerpts: int
    recalled_tokens: int
    recall_ms: float | None             # MemoryService.recall inside the gateway, timed around it
    first_delta_ms: float               # chat.send sent → first chat.delta at the client


@dataclass(slots=True)
class ModeRun:
    asked: list[Asked] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    chunks: int = 0
    embedder_reason: str = ""


def _tokens(i: int) -> str:
    return f"bench-conversation-token-{i:05d}-0123456789abcdef"


def _bench_config(data_dir: Path, fake: FakeOpenAI, users: dict[str, str], embedder: str,
                  compaction: bool = True) -> Config:
    """A gateway with the product's defaults but for: one ``[[auth.users]]`` entry per
    conversation, the fake model, the chosen embedder, no episodes (their summaries would be the
    fake model's replies), a session quota no replay hits and ``chat.compaction`` as asked."""
    return make_config(
        data_dir,
        llm={"base_url": fake.base_url, "api_key": "sk-bench", "model": "fake-model",
             "max_retries": 0},
        auth={"token": None, "users": [{"name": user, "token": _tokens(i)}
                                       for i, user in enumerate(users.values())]},
        memory={"embedder": embedder, "episodes": False},
        quotas={"sessions_per_minute": 1_000_000},
        chat={"compaction": compaction},
    )


def _import_turns(conv: Conversation, sessions: Sequence[int]) -> tuple[ImportTurn, ...]:
    roles = _roles(conv)
    return tuple(ImportTurn(roles[t.speaker], t.text, (sess.date + TURN_STEP * i).isoformat(),
                            t.speaker)
                 for si in sessions for sess in (conv.sessions[si],)
                 for i, t in enumerate(sess.turns))


def _one_session(conv: Conversation) -> ImportConversation:
    first = conv.sessions[0]
    return ImportConversation(f"{conv.id}/all", f"{conv.id} (one session)", first.date.isoformat(),
                              _import_turns(conv, range(len(conv.sessions))))


def _separate(conv: Conversation) -> list[ImportConversation]:
    return [ImportConversation(f"{conv.id}/{s.id}",
                               f"{conv.id} / {s.id} ({s.date.date().isoformat()})",
                               s.date.isoformat(), _import_turns(conv, [si]))
            for si, s in enumerate(conv.sessions)]


def fake_reply(messages: list[dict[str, Any]]) -> str:
    """The fake model's answers: :data:`REPLY` to a chat run; to compaction's summary request,
    the new messages it was given, verbatim (an *extractive* summary: the summary column then
    shows what the product handed compaction and kept of it, an upper bound for a real model)."""
    first = messages[0] if messages else {}
    if COMPACTION_INSTRUCTION is not None and first.get("role") == "system" \
            and first.get("content") == COMPACTION_INSTRUCTION:
        body = str(messages[-1].get("content") or "")
        return body.split("New messages:\n", 1)[-1]
    return REPLY


async def _compacted(app: App) -> None:
    """Wait for the gateway's compaction jobs in flight, where the product has them."""
    compactor = getattr(app.runs, "compactor", None)
    idle = getattr(compactor, "idle", None)
    if idle is not None:
        await idle()


def _service(app: App) -> MemoryService:
    service = app.memory.service if app.memory is not None else None
    if not isinstance(service, MemoryService):
        raise RuntimeError("the gateway has no SQLite memory service (memory disabled or "
                           "another backend)")
    return service


class _RecallTimer:
    """Times every call of the gateway's own ``MemoryService.recall`` (wrapped on the instance,
    the product's code unchanged); a run reads the samples taken while it ran."""

    def __init__(self, service: MemoryService) -> None:
        self.samples: list[float] = []
        original = service.recall

        async def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                self.samples.append((time.perf_counter() - started) * 1000)

        service.recall = timed  # type: ignore[method-assign]


async def _await_run(client: Client, run_id: str, sent: float) -> float:
    first: float | None = None
    async with asyncio.timeout(RUN_TIMEOUT_S):
        while True:
            event = await client.next_event(timeout=RUN_TIMEOUT_S)
            params = event.get("params") or {}
            if params.get("runId") != run_id:
                continue
            if event.get("method") == "chat.delta" and first is None:
                first = time.perf_counter()
            if event.get("method") in ("chat.final", "chat.error", "chat.aborted"):
                if event["method"] != "chat.final":
                    raise RuntimeError(f"run ended with {event['method']}: {params}")
                return ((first or time.perf_counter()) - sent) * 1000


def _prompt_of(requests: Sequence[RecordedRequest], question: str) -> list[dict[str, Any]]:
    for request in reversed(requests):
        body = request.json
        if (request.path != "/v1/chat/completions" or not isinstance(body, dict)
                or is_title_request(body)):
            continue
        messages = body.get("messages")
        if isinstance(messages, list) and messages and messages[-1].get("content") == question:
            return messages
    raise RuntimeError("the fake model recorded no prompt ending with the question "
                       f"{question[:60]!r}")


async def _send(client: Client, key: str, text: str) -> float:
    """``chat.send`` and wait for its ``chat.final``; returns send → first delta, ms."""
    sent = time.perf_counter()
    run_id = (await client.call("chat.send", {"sessionKey": key, "message": text}))["runId"]
    return await _await_run(client, run_id, sent)


async def _ask(app: App, client: Client, fake: FakeOpenAI, timer: _RecallTimer, key: str,
               q: Question, *, negative: bool, asked_as: str, turns: dict[str, Turn],
               warmup: int = 0) -> Asked:
    for _ in range(warmup):
        await _send(client, key, WARMUP)
        await _compacted(app)
    fake.requests.clear()
    timer.samples.clear()
    first_delta_ms = await _send(client, key, q.question)
    parts = split_prompt(_prompt_of(list(fake.requests), q.question), q.question)
    evidence = [turns[e] for e in q.evidence]
    found = evidence_places(parts, evidence) if not negative else {p: set() for p in PLACES}
    anywhere = set().union(*found.values())
    n = len(evidence)
    return Asked(q, negative, asked_as, {p: len(found[p]) / n for p in PLACES}, len(anywhere) / n,
                 len(anywhere) == n, parts.tokens, len(parts.excerpts),
                 sum(approx_tokens(e) for e in parts.excerpts),
                 sum(timer.samples) if timer.samples else None, first_delta_ms)


@asynccontextmanager
async def _clients(app: App, users: dict[str, str]) -> AsyncIterator[dict[str, Client]]:
    opened: dict[str, Client] = {}
    stack: list[Any] = []
    try:
        for i, conv_id in enumerate(users):
            cm = Client.connect(app.url, _tokens(i))
            opened[conv_id] = await cm.__aenter__()
            stack.append(cm)
        yield opened
    finally:
        for cm in reversed(stack):
            await cm.__aexit__(None, None, None)


def _jobs(dataset: Dataset, negatives: bool) -> Iterator[tuple[Question, bool, str]]:
    """(question, negative, the conversation whose user asks it), positives and negatives
    interleaved."""
    pairs = negative_pairs(dataset) if negatives else {}
    for q in dataset.questions:
        yield q, False, q.conversation
        if q.conversation in pairs:
            yield q, True, pairs[q.conversation]


async def _run_mode(mode: str, dataset: Dataset, *, embedder: str, cache: Path | None,
                    negatives: bool, progress: _Progress, warmup: int = 1,
                    compaction: bool = True) -> ModeRun:
    result = ModeRun()
    users = {c.id: user_name(ci, c.id) for ci, c in enumerate(dataset.conversations)}
    convs = {c.id: c for c in dataset.conversations}
    turns = {c.id: {t.id: t for s in c.sessions for t in s.turns} for c in dataset.conversations}
    jobs = list(_jobs(dataset, negatives))
    async with FakeOpenAI() as fake:
        fake.configure(reply=fake_reply)
        with tempfile.TemporaryDirectory(prefix=f"recalld-conversation-{mode}-") as tmp:
            config = _bench_config(Path(tmp), fake, users, embedder, compaction)
            if mode == "separate":
                await _import_and_index(config, dataset, users, cache, progress, result)

            started = time.perf_counter()
            async with running_gateway(config, embedder=_embedder(config, embedder)) as app, \
                    _clients(app, users) as clients:
                service = _service(app)
                await service.wait_idle()
                if mode == "one-session" and cache is not None:
                    await asyncio.to_thread(_share_cache, service.db_path, cache, "seed")
                timer = _RecallTimer(service)
                result.seconds["start"] = time.perf_counter() - started
                result.embedder_reason = service.embedder_reason
                started = time.perf_counter()
                for ji, (q, negative, asked_as) in enumerate(jobs):
                    client, user = clients[asked_as], users[asked_as]
                    if mode == "separate":
                        key = (await client.call("sessions.create",
                                                 {"title": "question"}))["sessionKey"]
                    else:
                        key = await _write_copy(app, service, user, convs[asked_as], cache)
                    result.asked.append(await _ask(
                        app, client, fake, timer, key, q, negative=negative, asked_as=asked_as,
                        turns=turns[q.conversation], warmup=warmup if mode == "one-session" else 0))
                    await _compacted(app)
                    # the index as a question meets it (every question's session is deleted)
                    if ji == 0:
                        result.chunks = int((await service.status())["chunks"])
                    await _delete(client, key)
                    progress(f"{mode}: {ji + 1}/{len(jobs)} questions asked")
                progress(f"{mode}: {len(jobs)} questions asked", final=True)
                result.seconds["ask"] = time.perf_counter() - started
                if cache is not None:
                    await asyncio.to_thread(_share_cache, service.db_path, cache, "keep")
    return result


def _embedder(config: Config, name: str) -> tuple[Any, str]:
    picked, reason = select_embedder(effective_memory_config(config))
    if picked is None and name != "none":
        raise RuntimeError(f"embedder {name!r} is not available: {reason}")
    return picked, reason


async def _import_and_index(config: Config, dataset: Dataset, users: dict[str, str],
                            cache: Path | None, progress: _Progress, result: ModeRun) -> None:
    """``recalld import``'s two steps: the importer writes each user's sessions, then the index
    is built with ``open_memory`` + ``sync_now`` (seeded from, and kept into, ``cache``)."""
    started = time.perf_counter()
    for conv in dataset.conversations:
        await asyncio.to_thread(import_conversations, config.data_dir, config.sessions,
                                users[conv.id], IMPORT_FORMAT, _separate(conv),
                                storage=config.storage)
    result.seconds["import"] = time.perf_counter() - started
    progress(f"separate: imported {len(dataset.conversations)} conversations", final=True)
    started = time.perf_counter()
    service = await open_memory(config, watch=False, catch_up=False,
                                embedder=_embedder(config, config.memory.embedder))
    try:
        if not isinstance(service, MemoryService):
            raise RuntimeError("not a SQLite memory service")
        if cache is not None:
            await asyncio.to_thread(_share_cache, service.db_path, cache, "seed")
            report = await _keeping(service.sync_now(), service.db_path, cache)
        else:
            report = await service.sync_now()
        if report.error:
            raise RuntimeError(f"indexing failed: {report.error}")
    finally:
        await close_memory(service)
    result.seconds["index"] = time.perf_counter() - started
    progress(f"separate: indexed ({report.chunks_written} chunks, {report.embedded} embedded, "
             f"{report.cache_hits} from cache)", final=True)


async def _write_copy(app: App, service: MemoryService, user: str, conv: Conversation,
                      cache: Path | None) -> str:
    """The whole conversation as one new session of ``user``, written through the gateway's own
    session store with the dataset's timestamps, then indexed; returns its key."""
    whole = _one_session(conv)

    def write() -> str:
        session = app.store.create(user, title=whole.title, created_at=whole.created_at)
        for turn in whole.turns:
            app.store.append_message(user, session.session_key, role=turn.role,
                                     content=turn.content, name=turn.name, ts=turn.ts)
        app.store.flush()
        return session.session_key

    key = await asyncio.to_thread(write)
    # A first copy embeds the whole conversation: keep its vectors as they come (a stopped run's
    # too).
    report = await (_keeping(service.sync_now(), service.db_path, cache) if cache is not None
                    else service.sync_now())
    if report.error:
        raise RuntimeError(f"indexing failed: {report.error}")
    return key


async def _delete(client: Client, key: str) -> None:
    for attempt in range(50):  # the run's end may still hold the session for a moment
        try:
            await client.call("sessions.delete", {"sessionKey": key})
            return
        except RpcError:
            if attempt == 49:
                raise
            await asyncio.sleep(0.1)


# --- figures -----------------------------------------------------------------------------------


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _positives(asked: Sequence[Asked]) -> dict[str, float]:
    return {**{p: _mean([a.places[p] for a in asked]) for p in PLACES},
            "any": _mean([a.reached for a in asked]),
            "all": _mean([1.0 if a.all_reached else 0.0 for a in asked]),
            "questions": float(len(asked))}


def summarise(mode: str, run: ModeRun) -> dict[str, Any]:
    """One mode's figures (the ``--json`` shape of ``modes[MODE]``)."""
    pos = [a for a in run.asked if not a.negative]
    neg = [a for a in run.asked if a.negative]
    by_cat: dict[str, list[Asked]] = defaultdict(list)
    for a in pos:
        by_cat[a.question.category].append(a)
    recall_ms = [a.recall_ms for a in pos + neg if a.recall_ms is not None]
    out: dict[str, Any] = {
        "questions": len(pos),
        "evidence": {"overall": _positives(pos),
                     "by_category": {c: _positives(by_cat[c]) for c in sorted(by_cat)}},
        "promptTokens": {"mean": _mean([float(a.prompt_tokens) for a in pos]),
                         **(_percentiles([float(a.prompt_tokens) for a in pos]) if pos else {})},
        "recalledTokens": _mean([float(a.recalled_tokens) for a in pos]),
        "recalledExcerpts": _mean([float(a.excerpts) for a in pos]),
        "recallMs": _percentiles(recall_ms) if recall_ms else None,
        "recallCalls": len(recall_ms),
        "firstDeltaMs": _percentiles([a.first_delta_ms for a in pos + neg]) if run.asked else None,
        "chunks": run.chunks,
        "seconds": {k: round(v, 1) for k, v in run.seconds.items()},
    }
    if neg:
        out["negatives"] = {"pairing": NEGATIVE_PAIRING, "questions": len(neg),
                            "anyRecalled": _mean([1.0 if a.excerpts else 0.0 for a in neg]),
                            "excerpts": _mean([float(a.excerpts) for a in neg]),
                            "tokens": _mean([float(a.recalled_tokens) for a in neg])}
    return out


def per_question(mode: str, run: ModeRun) -> list[dict[str, Any]]:
    return [{"mode": mode, "question": a.question.question, "conversation": a.question.conversation,
             "askedAs": a.asked_as, "negative": a.negative, "category": a.question.category,
             "evidence": list(a.question.evidence), **a.places, "any": a.reached,
             "promptTokens": a.prompt_tokens, "excerpts": a.excerpts,
             "recalledTokens": a.recalled_tokens, "recallMs": a.recall_ms,
             "firstDeltaMs": a.first_delta_ms} for a in run.asked]


async def run_conversation_benchmark(dataset: Dataset, *, dataset_name: str, embedder: str = "none",
                                     modes: Sequence[str] = MODES, negatives: bool = True,
                                     embedding_cache: Path | None = None, warmup: int = 1,
                                     compaction: bool = True,
                                     progress_stream: TextIO | None = None) -> dict[str, Any]:
    """Every mode of ``modes`` on ``dataset``; the report (the ``--json`` shape)."""
    if negatives and len(dataset.conversations) < 2:
        negatives = False  # nothing to ask a negative in; the report says so
    progress = _Progress(progress_stream)
    report: dict[str, Any] = {
        "dataset": dataset_name, "embedder": embedder, "granularity": "chunk",
        "granularityNote": GRANULARITY_NOTE, "conversations": len(dataset.conversations),
        "questions": len(dataset.questions), "turns": dataset.turn_count, "negatives": negatives,
        "summaryTag": SUMMARY_OPEN, "warmup": warmup,
        "compaction": COMPACTION_INSTRUCTION is not None and compaction,
        "latencyNote": "recallMs: MemoryService.recall inside the gateway, timed around the call; "
                       "firstDeltaMs: chat.send sent -> first chat.delta at the client",
        "modes": {}, "perQuestion": [],
    }
    for mode in modes:
        run = await _run_mode(mode, dataset, embedder=embedder, cache=embedding_cache,
                              negatives=negatives, progress=progress, warmup=warmup,
                              compaction=compaction)
        report["modes"][mode] = summarise(mode, run)
        report["perQuestion"] += per_question(mode, run)
        report["embedderReason"] = run.embedder_reason
    return report


def format_report(report: dict[str, Any]) -> str:
    lines = [
        f"dataset {report['dataset']}: {report['conversations']} conversations, {report['turns']} "
        f"turns, {report['questions']} questions",
        f"embedder {report['embedder']} ({report.get('embedderReason', '')}); granularity chunk: "
        f"{report['granularityNote']}",
        "evidence reached the prompt (share of evidence turns), by where; "
        f"summary = {SUMMARY_OPEN} in the system message (compaction "
        f"{'on' if report['compaction'] else 'off or absent'}; the fake model summarises "
        f"extractively); one-session: {report['warmup']} warm-up message(s) before each question",
    ]
    cols = (*PLACES, "any", "all")
    width = max([14] + [len(c) + 1 for b in report["modes"].values()
                        for c in b["evidence"]["by_category"]])
    header = f"{'mode':<12} {'category':<{width}}" + "".join(f"{c:>9}" for c in cols) + f"{'n':>6}"
    lines += ["", header, "-" * len(header)]
    for mode, block in report["modes"].items():
        rows = [("overall", block["evidence"]["overall"]),
                *block["evidence"]["by_category"].items()]
        for i, (cat, values) in enumerate(rows):
            lines.append(f"{mode if i == 0 else '':<12} "
                         f"{cat:<{width}}" + "".join(f"{values[c]:>9.3f}" for c in cols)
                         + f"{int(values['questions']):>6}")
        lines.append("")
    header = (f"{'mode':<12}{'prompt tok':>11}{'p50':>7}{'p99':>7}{'recalled':>9}{'excerpts':>9}"
              f"{'recall p50':>11}{'p99':>7}{'1st delta p50':>14}{'p99':>7}{'chunks':>8}")
    lines += [header, "-" * len(header)]
    for mode, block in report["modes"].items():
        tok, rms, fd = block["promptTokens"], block["recallMs"], block["firstDeltaMs"]
        lines.append(
            f"{mode:<12}{tok['mean']:>11.0f}{tok.get('p50', 0):>7.0f}{tok.get('p99', 0):>7.0f}"
            f"{block['recalledTokens']:>9.0f}{block['recalledExcerpts']:>9.2f}"
            + (f"{rms['p50']:>9.0f}ms{rms['p99']:>5.0f}ms" if rms else f"{'n/a':>11}{'':>7}")
            + (f"{fd['p50']:>12.0f}ms{fd['p99']:>5.0f}ms" if fd else f"{'n/a':>14}{'':>7}")
            + f"{block['chunks']:>8}")
    lines.append("(prompt tokens: every message, memory.approx_tokens + 4 each as "
                 "gateway/chat/prompt.py counts; recalled: tokens of the recall block's excerpts "
                 "per question; recall: MemoryService.recall timed inside the gateway; 1st delta: "
                 "chat.send → first chat.delta)")
    lines.append("")
    if report["negatives"]:
        header = (f"{'negatives':<12}{'questions':>10}{'any-recalled':>14}{'excerpts':>10}"
                  f"{'tokens':>9}")
        lines += [header, "-" * len(header)]
        for mode, block in report["modes"].items():
            neg = block.get("negatives")
            if neg:
                lines.append(f"{mode:<12}{neg['questions']:>10}{neg['anyRecalled']:>14.3f}{neg['excerpts']:>10.2f}"
                             f"{neg['tokens']:>9.1f}")
        lines.append(f"(negatives: {NEGATIVE_PAIRING})")
    else:
        lines.append("negatives: not run (they need at least two conversations)")
    secs = "; ".join(f"{mode} " + ", ".join(f"{k} {v:.0f} s" for k, v in block["seconds"].items())
                     for mode, block in report["modes"].items())
    lines.append(f"time: {secs}")
    return "\n".join(lines).rstrip() + "\n"


def limited(dataset: Dataset, conversations: int | None, questions: int | None) -> Dataset:
    """The first ``conversations`` conversations, and at most ``questions`` questions of each."""
    if conversations is not None:
        dataset = only_conversations(dataset, [c.id for c in dataset.conversations[:conversations]])
    if questions is not None:
        seen: dict[str, int] = defaultdict(int)
        kept: list[Question] = []
        for q in dataset.questions:
            if seen[q.conversation] < questions:
                seen[q.conversation] += 1
                kept.append(q)
        dataset = Dataset(dataset.conversations, tuple(kept))
    return dataset


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python bench/conversation.py",
        description="What reaches the model's prompt when a dataset's conversations are replayed "
                    "through a real gateway (see bench/README.md).")
    parser.add_argument("dataset", type=Path, help="dataset JSON in bench/recall.py's format")
    parser.add_argument("--embedder", choices=("local", "none"), default="local",
                        help="local: the bundled ONNX model (default); none: keyword search only")
    parser.add_argument("--limit", type=int, default=None, metavar="N",
                        help="only the first N conversations")
    parser.add_argument("--questions", type=int, default=None, metavar="N",
                        help="at most the first N questions of each conversation")
    parser.add_argument("--conversations", default=None, metavar="ID,ID",
                        help="only these conversations")
    parser.add_argument("--modes", default=",".join(MODES), metavar="MODE,MODE",
                        help=f"which replays (default: {','.join(MODES)})")
    parser.add_argument("--granularity", choices=("chunk", "turn"), default="chunk",
                        help="chunk only: " + GRANULARITY_NOTE)
    parser.add_argument("--no-negatives", action="store_true", help="skip the negatives")
    parser.add_argument("--compaction", choices=("on", "off"), default="on",
                        help="chat.compaction in the replaying gateway (off: what in-session "
                             "recall does alone)")
    parser.add_argument("--warmup", type=int, default=1, metavar="N",
                        help="one-session: messages sent into the replayed session before each "
                             "question, each followed by the compaction it triggers (default 1; 0: "
                             "the question first)")
    parser.add_argument("--embedding-cache", type=Path, default=None, metavar="FILE",
                        help="keep vectors in FILE across runs (bench/recall.py's cache "
                             "works here too)")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT",
                        help="write the figures, and every question's, as JSON")
    return parser


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None,
         stderr: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    out, err = stdout or sys.stdout, stderr or sys.stderr
    if args.granularity != "chunk":
        err.write(f"--granularity turn: {GRANULARITY_NOTE}\n")
        return 2
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        err.write(f"--modes: choose from {', '.join(MODES)}\n")
        return 2
    try:
        dataset = load_dataset(args.dataset)
        if args.conversations:
            dataset = only_conversations(dataset, args.conversations.split(","))
        dataset = limited(dataset, args.limit, args.questions)
    except (OSError, DatasetError) as exc:
        err.write(f"error: {exc}\n")
        return 2
    try:
        report = asyncio.run(run_conversation_benchmark(
            dataset, dataset_name=str(args.dataset), embedder=args.embedder, modes=modes,
            negatives=not args.no_negatives, embedding_cache=args.embedding_cache,
            warmup=max(0, args.warmup), compaction=args.compaction == "on", progress_stream=err))
    except (ValueError, RuntimeError) as exc:
        err.write(f"error: {exc}\n")
        return 2
    out.write(format_report(report))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    from gateway.logs import configure_logging

    configure_logging("error")  # the figures are the output; a deleted session's late jobs warn
    raise SystemExit(main())
