"""Retrieval-quality harness: how well ``memory.search`` finds the turns a question needs.

    python bench/recall.py DATASET [--embedder local|openai|none] [--granularity chunk|turn]
                           [--k 10] [--rrf-k 60] [--candidates 50] [--json OUT]

Each conversation of the dataset becomes its own user in a fresh data dir, written through the
real ``SessionStore`` (one transcript per dataset session, messages dated from the session
date, the speaker kept as the message ``name``), indexed by the real indexer with the chosen
embedder, and every question is asked through ``MemoryService.search`` scoped to its
conversation's user in ``keyword``, ``vector`` and ``hybrid`` mode. Returned chunks are mapped
back to turn ids through their line ranges and scored against the question's evidence turns.
The dataset format and the metric definitions are in ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import random
import re
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO, TypeVar

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:  # run as `python bench/recall.py` from anywhere
    sys.path.insert(0, str(_REPO))

import orjson  # noqa: E402

from gateway.config import ChatConfig  # noqa: E402
from memory import SyncProgress  # noqa: E402
from memory.chunking import approx_tokens  # noqa: E402
from memory.config import MemoryConfig  # noqa: E402
from memory.context import RECALL_QUERY_CHARS  # noqa: E402
from memory.embedders.embeddings import Embedder, select_embedder  # noqa: E402
from memory.retrieval.recall import CUT_MARK  # noqa: E402
from memory.retrieval.request import SearchHit  # noqa: E402
from memory.sqlite.service import MemoryService  # noqa: E402
from sessions import ForwardReader, SessionsConfig, SessionStore  # noqa: E402

__all__ = [
    "METRICS",
    "MODES",
    "Dataset",
    "DatasetError",
    "LoadedCorpus",
    "dataset_from_json",
    "hit_at",
    "hits_to_turns",
    "load_corpus",
    "main",
    "negative_pairs",
    "negative_scores",
    "mrr",
    "ndcg_at",
    "recall_at",
    "run_benchmark",
    "score_question",
]

MODES = ("keyword", "vector", "hybrid")
METRICS = ("recall@5", "recall@10", "hit@5", "mrr", "ndcg@10", "tokens@5", "tokens@10")
# Recall into a prompt (--recall): what MemoryService.recall hands the chat, scored.
PROMPT_METRICS = ("prompt-recall", "prompt-all", "prompt-tokens")
# Negatives (--negatives): recall asked for a question in an index that lacks its conversation.
NEGATIVE_METRICS = ("any-recalled", "excerpts", "tokens")
NEGATIVE_PAIRING = ("each question asked as the user of the next conversation in the file (the "
                    "last's as the first's): that user's index holds none of the "
                    "question's sessions")
RECALL_K = ChatConfig().recall_k   # the chat's default number of recalled chunks
UNCATEGORIZED = "uncategorized"
TURN_STEP = timedelta(minutes=1)   # turn i of a session is dated session date + i minutes


class DatasetError(ValueError):
    """The dataset file does not have the documented shape."""


# --- dataset ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Turn:
    id: str
    speaker: str
    text: str


@dataclass(frozen=True, slots=True)
class DatasetSession:
    id: str
    date: datetime
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    sessions: tuple[DatasetSession, ...]


@dataclass(frozen=True, slots=True)
class Question:
    conversation: str
    question: str
    evidence: tuple[str, ...]
    category: str
    date: datetime | None = None          # when it was asked, if the dataset says
    asked_before: str | None = None       # or the turn it was asked before (RealMem)


@dataclass(frozen=True, slots=True)
class Dataset:
    conversations: tuple[Conversation, ...]
    questions: tuple[Question, ...]

    @property
    def turn_count(self) -> int:
        return sum(len(s.turns) for c in self.conversations for s in c.sessions)


def _parse_date(value: object, where: str) -> datetime:
    if not isinstance(value, str) or not value:
        raise DatasetError(f"{where}.date: expected an ISO-8601 date or date-time string")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise DatasetError(f"{where}.date: {value!r} is not ISO-8601 (e.g. 2024-03-02 or "
                           "2024-03-02T18:30)") from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _str(obj: dict[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and key == "id":
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"{where}.{key}: expected a non-empty string")
    return value


def _list(obj: dict[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key)
    if not isinstance(value, list) or not value:
        raise DatasetError(f"{where}.{key}: expected a non-empty list")
    return value


def dataset_from_json(data: object) -> Dataset:
    """Validate a parsed dataset; raises :class:`DatasetError` naming the first bad field."""
    if not isinstance(data, dict):
        raise DatasetError("dataset: expected an object with 'conversations' and 'questions'")
    conversations: list[Conversation] = []
    turn_ids: dict[str, set[str]] = {}
    for ci, raw_conv in enumerate(_list(data, "conversations", "dataset")):
        where = f"conversations[{ci}]"
        if not isinstance(raw_conv, dict):
            raise DatasetError(f"{where}: expected an object")
        conv_id = _str(raw_conv, "id", where)
        if conv_id in turn_ids:
            raise DatasetError(f"{where}.id: duplicate conversation id {conv_id!r}")
        seen: set[str] = set()
        sessions: list[DatasetSession] = []
        for si, raw_sess in enumerate(_list(raw_conv, "sessions", where)):
            swhere = f"{where}.sessions[{si}]"
            if not isinstance(raw_sess, dict):
                raise DatasetError(f"{swhere}: expected an object")
            turns: list[Turn] = []
            for ti, raw_turn in enumerate(_list(raw_sess, "turns", swhere)):
                twhere = f"{swhere}.turns[{ti}]"
                if not isinstance(raw_turn, dict):
                    raise DatasetError(f"{twhere}: expected an object")
                turn = Turn(_str(raw_turn, "id", twhere), _str(raw_turn, "speaker", twhere),
                            _str(raw_turn, "text", twhere))
                if turn.id in seen:
                    raise DatasetError(f"{twhere}.id: duplicate turn id {turn.id!r} in "
                                       f"conversation {conv_id!r}")
                seen.add(turn.id)
                turns.append(turn)
            sessions.append(DatasetSession(_str(raw_sess, "id", swhere),
                                           _parse_date(raw_sess.get("date"), swhere), tuple(turns)))
        turn_ids[conv_id] = seen
        conversations.append(Conversation(conv_id, tuple(sessions)))
    questions: list[Question] = []
    for qi, raw_q in enumerate(_list(data, "questions", "dataset")):
        where = f"questions[{qi}]"
        if not isinstance(raw_q, dict):
            raise DatasetError(f"{where}: expected an object")
        conv_id = _str(raw_q, "conversation", where)
        if conv_id not in turn_ids:
            raise DatasetError(f"{where}.conversation: unknown conversation {conv_id!r}")
        evidence = _list(raw_q, "evidence", where)
        for e in evidence:
            if not isinstance(e, str) or e not in turn_ids[conv_id]:
                raise DatasetError(f"{where}.evidence: {e!r} is not a turn id of conversation "
                                   f"{conv_id!r}")
        category = raw_q.get("category", UNCATEGORIZED)
        if not isinstance(category, str) or not category:
            raise DatasetError(f"{where}.category: expected a non-empty string when present")
        date = _parse_date(raw_q["date"], where) if raw_q.get("date") is not None else None
        asked_before = raw_q.get("asked_before_turn")
        if asked_before is not None and not isinstance(asked_before, str):
            raise DatasetError(f"{where}.asked_before_turn: expected a turn id string when present")
        questions.append(Question(conv_id, _str(raw_q, "question", where),
                                  tuple(dict.fromkeys(evidence)), category, date, asked_before))
    return Dataset(tuple(conversations), tuple(questions))


def only_conversations(dataset: Dataset, ids: Sequence[str]) -> Dataset:
    """The dataset cut to the conversations ``ids`` and their questions (for a quicker run)."""
    unknown = set(ids) - {c.id for c in dataset.conversations}
    if unknown:
        raise DatasetError(f"unknown conversation id(s): {', '.join(sorted(unknown))}")
    keep = set(ids)
    return Dataset(tuple(c for c in dataset.conversations if c.id in keep),
                   tuple(q for q in dataset.questions if q.conversation in keep))


def question_moments(dataset: Dataset) -> list[datetime | None]:
    """When each question was asked: its ``date``, else the time of the first turn whose id
    sorts at or after its ``asked_before_turn`` (RealMem's ids sort in history order, and the
    question's own turn may have been removed), else None (after the whole history)."""
    timelines: dict[str, list[tuple[str, datetime]]] = {
        c.id: sorted((t.id, s.date + TURN_STEP * i) for s in c.sessions
                     for i, t in enumerate(s.turns))
        for c in dataset.conversations
    }
    moments: list[datetime | None] = []
    for q in dataset.questions:
        moment = q.date
        if moment is None and q.asked_before is not None:
            timeline = timelines[q.conversation]
            at = bisect.bisect_left(timeline, (q.asked_before,))
            moment = timeline[at][1] if at < len(timeline) else None
        moments.append(moment)
    return moments


def load_dataset(path: Path) -> Dataset:
    try:
        data = orjson.loads(Path(path).read_bytes())
    except orjson.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not JSON ({exc})") from None
    return dataset_from_json(data)


# --- metrics (pure) ----------------------------------------------------------------------------
#
# ``ranked`` is the result list of one search, best first, each entry the set of turn ids the
# returned chunk covers; ``evidence`` is the question's evidence turn ids.


def _first_ranks(ranked: Sequence[Iterable[str]], evidence: Iterable[str],
                 k: int) -> dict[str, int]:
    """Evidence turn → 1-based rank of the first of the top ``k`` results that covers it."""
    wanted = set(evidence)
    found: dict[str, int] = {}
    for rank, turns in enumerate(ranked[:k], start=1):
        for turn in wanted.intersection(turns):
            found.setdefault(turn, rank)
    return found


def recall_at(ranked: Sequence[Iterable[str]], evidence: Sequence[str], k: int) -> float:
    """Fraction of the evidence turns covered by the top ``k`` results."""
    wanted = set(evidence)
    return len(_first_ranks(ranked, wanted, k)) / len(wanted) if wanted else 0.0


def hit_at(ranked: Sequence[Iterable[str]], evidence: Sequence[str], k: int) -> float:
    """1.0 when any of the top ``k`` results covers an evidence turn, else 0.0."""
    return 1.0 if _first_ranks(ranked, evidence, k) else 0.0


def mrr(ranked: Sequence[Iterable[str]], evidence: Sequence[str]) -> float:
    """Reciprocal rank of the first result that covers any evidence turn (0.0 when none does)."""
    found = _first_ranks(ranked, evidence, len(ranked))
    return 1.0 / min(found.values()) if found else 0.0


def ndcg_at(ranked: Sequence[Iterable[str]], evidence: Sequence[str], k: int) -> float:
    """nDCG@k with one unit of gain per evidence turn, earned at the first result covering it.

    DCG = Σ over evidence turns found in the top k of 1/log2(1 + rank); the ideal is every
    evidence turn in its own result at ranks 1, 2, … (what a one-turn-per-result retriever can
    best do). A chunk holding several evidence turns can exceed that ideal, so the value is
    capped at 1.0.
    """
    wanted = set(evidence)
    if not wanted:
        return 0.0
    dcg = sum(1.0 / math.log2(1 + rank) for rank in _first_ranks(ranked, wanted, k).values())
    ideal = sum(1.0 / math.log2(1 + rank) for rank in range(1, min(len(wanted), k) + 1))
    return min(1.0, dcg / ideal)


def score_question(ranked: Sequence[Iterable[str]], evidence: Sequence[str],
                   contents: Sequence[str]) -> dict[str, float]:
    """Every metric of one search; ``contents`` are the returned chunk texts, best first."""
    return {
        "recall@5": recall_at(ranked, evidence, 5),
        "recall@10": recall_at(ranked, evidence, 10),
        "hit@5": hit_at(ranked, evidence, 5),
        "mrr": mrr(ranked, evidence),
        "ndcg@10": ndcg_at(ranked, evidence, 10),
        "tokens@5": float(sum(approx_tokens(c) for c in contents[:5])),
        "tokens@10": float(sum(approx_tokens(c) for c in contents[:10])),
    }


def _mean(rows: Sequence[dict[str, float]], metrics: Sequence[str] = METRICS) -> dict[str, float]:
    return {m: (sum(r[m] for r in rows) / len(rows) if rows else 0.0) for m in metrics}


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    ordered = sorted(values)
    p50, p99 = (ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.5, 0.99))
    return {"p50": p50, "p99": p99, "max": ordered[-1]}


def prompt_scores(hits: Sequence[SearchHit], line_map: LineMap, turn_text: dict[str, str],
                  evidence: Sequence[str]) -> dict[str, float]:
    """What recall put in the prompt, scored: the share of evidence turns inside it, whether all
    of them are, and its approximate tokens. An excerpt the budget cut (it ends with ``…``)
    holds a turn only when the turn's opening words survived the cut."""
    covered: set[str] = set()
    for hit in hits:
        cut = hit.content.endswith(CUT_MARK)
        for turn in hits_to_turns(hit, line_map):
            if not cut or turn_text.get(turn, "")[:40] in hit.content:
                covered.add(turn)
    wanted = set(evidence)
    found = len(wanted & covered)
    return {"prompt-recall": found / len(wanted) if wanted else 0.0,
            "prompt-all": 1.0 if wanted and found == len(wanted) else 0.0,
            "prompt-tokens": float(sum(approx_tokens(h.content) for h in hits))}


# --- loading through the session store ---------------------------------------------------------

LineMap = dict[tuple[str, int], str]   # (session_key, transcript line) → turn id


@dataclass(slots=True)
class LoadedCorpus:
    users: dict[str, str] = field(default_factory=dict)   # conversation id → store user
    line_map: LineMap = field(default_factory=dict)
    transcripts: int = 0
    turns: int = 0


def hits_to_turns(hit: SearchHit | Any, line_map: LineMap) -> list[str]:
    """The turn ids a returned chunk covers, in transcript order (lines without a turn skipped)."""
    out: list[str] = []
    for line in range(hit.line_start, hit.line_end + 1):
        turn = line_map.get((hit.session_key, line))
        if turn is not None:
            out.append(turn)
    return out


def user_name(index: int, conversation_id: str) -> str:
    """A store-valid user name (``[A-Za-z0-9_.-]{1,64}``), unique per conversation."""
    clean = re.sub(r"[^A-Za-z0-9_.-]", "_", conversation_id)[:48]
    return f"c{index:04d}-{clean}"


def _roles(conv: Conversation) -> dict[str, str]:
    """The conversation's first speaker is ``user``; every other speaker is ``assistant``."""
    first = conv.sessions[0].turns[0].speaker
    speakers = {t.speaker for s in conv.sessions for t in s.turns}
    return {name: ("user" if name == first else "assistant") for name in speakers}


def _check_lines(path: Path, expected: Sequence[tuple[int, str]]) -> None:
    """Verify (line number, message id) pairs against the transcript on disk, read the way the
    indexer reads it."""
    found = {entry.line: entry.message.id for entry in ForwardReader(path)}
    for line_no, message_id in expected:
        if found.get(line_no) != message_id:
            raise RuntimeError(f"{path}: line {line_no} is not message {message_id}; the line map "
                               "would be wrong")


def _seeded_session_keys(seed: int) -> Callable[[], str]:
    """Session keys from a seeded generator instead of ``uuid4``, for
    ``SessionStore(key_factory=…)``.

    The indexer walks transcripts in path order (``<user>/<sessionKey>.jsonl``), so chunk ids
    follow the keys, and the search breaks score ties by chunk id: with random keys the same
    dataset scores slightly differently on every run. Keys keep the store's shape (32 hex).
    """
    rng = random.Random(seed)
    return lambda: f"{rng.getrandbits(128):032x}"


def load_corpus(dataset: Dataset, data_dir: Path, granularity: str,
                progress: Callable[[str], None] | None = None, *, seed: int = 0) -> LoadedCorpus:
    """Write every conversation through the real ``SessionStore``; return the line → turn map.

    ``chunk``: one transcript per dataset session; message i (0-based) is transcript line i + 2
    (line 1 is the header), checked against the file. ``turn``: one transcript per turn (its
    line 2), so that no chunk can hold two turns — see ``bench/README.md``.
    """
    corpus = LoadedCorpus()
    store = SessionStore(data_dir, SessionsConfig(fsync="never"),
                         key_factory=_seeded_session_keys(seed))
    try:
        _load(dataset, data_dir, granularity, progress, store, corpus)
    finally:
        store.close()
    return corpus


def _load(dataset: Dataset, data_dir: Path, granularity: str,
          progress: Callable[[str], None] | None, store: SessionStore,
          corpus: LoadedCorpus) -> None:
    for ci, conv in enumerate(dataset.conversations):
        user = user_name(ci, conv.id)
        corpus.users[conv.id] = user
        roles = _roles(conv)
        for sess in conv.sessions:
            title = f"{conv.id} / {sess.id} ({sess.date.date().isoformat()})"
            groups = ([list(enumerate(sess.turns))] if granularity == "chunk"
                      else [[(i, t)] for i, t in enumerate(sess.turns)])
            for group in groups:
                created = sess.date + TURN_STEP * group[0][0]
                session = store.create(user, title=title, created_at=created)
                expected: list[tuple[int, str]] = []
                for line_offset, (i, turn) in enumerate(group):
                    ts = sess.date + TURN_STEP * i
                    msg = store.append_message(user, session.session_key, role=roles[turn.speaker],
                                               content=turn.text, name=turn.speaker,
                                               ts=ts.isoformat())
                    line = line_offset + 2
                    corpus.line_map[(session.session_key, line)] = turn.id
                    expected.append((line, msg.id))
                    corpus.turns += 1
                corpus.transcripts += 1
                store.flush()
                _check_lines(store.transcript_path(user, session.session_key), expected)
        if progress:
            progress(f"loading: conversation {ci + 1}/{len(dataset.conversations)}, "
                     f"{corpus.turns}/{dataset.turn_count} turns, {corpus.transcripts} transcripts")


# --- the run -----------------------------------------------------------------------------------


def longest_turn_tokens(dataset: Dataset) -> int:
    """Approximate tokens of the longest rendered turn (``name [ts]: text``; ts has a fixed
    width)."""
    stamp = "2000-01-01T00:00:00.000Z"
    return max((approx_tokens(f"{t.speaker} [{stamp}]: {t.text}")
                for c in dataset.conversations for s in c.sessions for t in s.turns), default=0)


def memory_config(granularity: str, *, embedder: str, k: int, rrf_k: int, candidates: int,
                  max_turn_tokens: int = 0, base: MemoryConfig | None = None) -> MemoryConfig:
    """The index and search settings of a run.

    ``chunk`` keeps the configured chunking (by default sized for the embedder). ``turn`` holds
    one turn per transcript, so chunk_tokens only has to exceed the longest turn for each turn
    to be exactly one whole chunk (never cut into segments).
    """
    base = base or MemoryConfig()
    chunk_tokens, overlap = base.chunk_tokens, base.overlap_tokens
    if granularity == "turn":
        chunk_tokens, overlap = max(16, max_turn_tokens + 1), 0
    max_k = max(k, 10)
    if candidates < max_k:
        raise ValueError(f"--candidates ({candidates}) must be at least max(--k, 10) = {max_k}")
    # Every other setting (fusion, weights, embedder options) is the base's, i.e. the defaults
    # a new user gets unless the caller changed them.
    return replace(
        base, enabled=True, embedder=embedder,  # type: ignore[arg-type]
        chunk_tokens=chunk_tokens, overlap_tokens=overlap, watch=False, debounce_ms=0,
        rrf_k=rrf_k, candidates=candidates, default_k=min(base.default_k, max_k), max_k=max_k,
    )


@dataclass(slots=True)
class RunResult:
    report: dict[str, Any]                        # the --json shape
    ran_as: dict[str, dict[str, int]]             # requested mode → {actual mode: searches}
    fallback_reasons: dict[str, set[str]]
    chunks: int
    transcripts: int
    turns: int
    embedder_reason: str
    seconds: dict[str, float]
    per_question: list[dict[str, Any]]
    as_of: RunResult | None = None


class _Progress:
    """Progress lines on stderr: overwritten in place on a terminal, throttled otherwise."""

    def __init__(self, stream: TextIO | None) -> None:
        self.stream = stream
        self.tty = bool(stream and getattr(stream, "isatty", lambda: False)())
        self.last = 0.0

    def __call__(self, text: str, *, final: bool = False) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        if not final and now - self.last < (0.2 if self.tty else 2.0):
            return
        self.last = now
        if self.tty:
            self.stream.write("\r\x1b[K" + text + ("\n" if final else ""))
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


async def run_benchmark(
    dataset: Dataset,
    *,
    dataset_name: str,
    embedder_name: str = "none",
    granularity: str = "chunk",
    k: int = 10,
    rrf_k: int = 60,
    candidates: int = 50,
    base_config: MemoryConfig | None = None,
    embedder: Embedder | None = None,
    data_dir: Path | None = None,
    progress_stream: TextIO | None = None,
    as_of: bool = False,
    also_as_of: bool = False,
    embedding_cache: Path | None = None,
    prompt: bool = False,
    negatives: bool = False,
) -> RunResult:
    """Load, index and ask; ``embedder`` overrides ``select_embedder`` (tests pass a fake).
    ``also_as_of`` asks a second time as of each question's moment, on the same index; that
    run's result is the returned one's ``as_of``. ``embedding_cache`` is a SQLite file whose
    vectors seed the run's index cache before indexing and receive its new ones after, so a
    rerun embeds only texts it has never seen (the index's own cache, keyed by model and text).
    ``prompt`` also scores, in the view over the whole history, what recall into a prompt
    (``MemoryService.recall``, the chat's code) puts before the model. ``negatives`` also asks
    that recall for each question as another conversation's user, whose index lacks the
    question's conversation (:func:`negative_pairs`): what it recalls there is noise."""
    if granularity not in ("chunk", "turn"):
        raise ValueError("granularity must be 'chunk' or 'turn'")
    if negatives and len(dataset.conversations) < 2:
        raise ValueError("--negatives needs at least two conversations (a question is asked in "
                         "another's index)")
    progress = _Progress(progress_stream)
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="recalld-recall-") as tmp:
        root = Path(data_dir) if data_dir is not None else Path(tmp)
        config = memory_config(granularity, embedder=embedder_name, k=k, rrf_k=rrf_k,
                               candidates=candidates, max_turn_tokens=longest_turn_tokens(dataset),
                               base=base_config)
        reason = "embedder passed in by the caller"
        if embedder is None:
            embedder, reason = select_embedder(config)
            if embedder is None and embedder_name != "none":
                raise RuntimeError(f"embedder {embedder_name!r} is not available: {reason}")
        service = MemoryService(root, config, embedder, embedder_reason=reason)
        await service.start(catch_up=False)  # the index exists before the transcripts do
        try:
            started = time.perf_counter()
            corpus = await asyncio.to_thread(load_corpus, dataset, root, granularity, progress)
            progress(f"loading: {len(dataset.conversations)} conversations, {corpus.turns} turns, "
                     f"{corpus.transcripts} transcripts", final=True)
            seconds["load"] = time.perf_counter() - started
            started = time.perf_counter()

            def on_sync(p: SyncProgress) -> None:
                if p.phase == "files":
                    progress(f"indexing: files {p.files_done}/{p.files_total}, "
                             f"chunks {p.chunks_written}")
                else:
                    progress(f"embedding: {p.embedded} embedded, {p.pending} pending")

            if embedding_cache is not None:
                seeded = await asyncio.to_thread(_share_cache, root / "memory.db",
                                                 embedding_cache, "seed")
                progress(f"embedding cache: {seeded} vectors from {embedding_cache}", final=True)
                sync = await _keeping(service.sync_now(progress=on_sync), root / "memory.db",
                                      embedding_cache)
            else:
                sync = await service.sync_now(progress=on_sync)
            status = await service.status()
            progress(f"indexed: {status['chunks']} chunks, {status['embedded']} embedded, "
                     f"{status['pending']} pending", final=True)
            if embedder is not None and (sync.error or status["pending"]):
                raise RuntimeError(f"indexing left {status['pending']} chunks without vectors: "
                                   f"{sync.error or status['lastError']}")
            seconds["index"] = time.perf_counter() - started

            views = [as_of] + ([True] if also_as_of and not as_of else [])
            results: list[RunResult] = []
            for view in views:
                started = time.perf_counter()
                results.append(await _ask(service, dataset, corpus, k, view, progress,
                                          dataset_name=dataset_name, embedder_name=embedder_name,
                                          granularity=granularity, prompt=prompt and not view,
                                          negatives=negatives and not view))
                results[-1].seconds.update(seconds, search=time.perf_counter() - started)
        finally:
            await service.close()
    for result in results:
        result.chunks, result.embedder_reason = int(status["chunks"]), reason
    if len(results) > 1:
        results[0].as_of = results[1]
    return results[0]


_CACHE_COLUMNS = "provider, model, endpoint_hash, content_hash, dims, vector"
# While a run embeds, its new vectors go to the cache file this often (and once at the end):
# embedding all of RealMem takes hours on a shared 2-core machine, and a run stopped half-way
# must leave what it embedded for the next one.
KEEP_EVERY_S = 60.0
T = TypeVar("T")


async def _keeping(sync: Awaitable[T], index_db: Path, cache_file: Path,
                   every_s: float = KEEP_EVERY_S) -> T:
    """Await ``sync`` while copying the index's embedding cache to ``cache_file`` every
    ``every_s`` seconds, then once more."""
    task = asyncio.ensure_future(sync)
    try:
        while not task.done():
            await asyncio.wait([task], timeout=every_s)
            if not task.done():
                await asyncio.to_thread(_share_cache, index_db, cache_file, "keep")
        await asyncio.to_thread(_share_cache, index_db, cache_file, "keep")
        return task.result()
    finally:
        task.cancel()


def _share_cache(index_db: Path, cache_file: Path, direction: str) -> int:
    """Copy embedding-cache rows between a run's index and a persistent cache file."""
    import apsw

    cache_file.parent.mkdir(parents=True, exist_ok=True)
    db = apsw.Connection(str(index_db))
    db.setbusytimeout(10_000)
    try:
        db.execute("ATTACH DATABASE ? AS shared", (str(cache_file),))
        db.execute("CREATE TABLE IF NOT EXISTS shared.embedding_cache AS SELECT * "
                   "FROM main.embedding_cache WHERE 0")
        db.execute("CREATE UNIQUE INDEX IF NOT EXISTS shared.embedding_cache_key "
                   "ON embedding_cache(provider, model, endpoint_hash, content_hash)")
        source, target = ("shared", "main") if direction == "seed" else ("main", "shared")
        with db:
            db.execute(f"INSERT OR IGNORE INTO {target}.embedding_cache ({_CACHE_COLUMNS}) "
                       f"SELECT {_CACHE_COLUMNS} FROM {source}.embedding_cache")
        return int(db.changes())
    finally:
        db.close()


def negative_pairs(dataset: Dataset) -> dict[str, str]:
    """Conversation id → the conversation whose index its questions are asked in as negatives:
    the next one in the file, the last's the first (``NEGATIVE_PAIRING``)."""
    ids = [c.id for c in dataset.conversations]
    return {cid: ids[(i + 1) % len(ids)] for i, cid in enumerate(ids)} if len(ids) > 1 else {}


def negative_scores(hits: Sequence[SearchHit]) -> dict[str, float]:
    """What recall put in a prompt where nothing belongs: whether anything, how many excerpts,
    their approximate tokens (the same count as ``prompt-tokens``)."""
    return {"any-recalled": 1.0 if hits else 0.0, "excerpts": float(len(hits)),
            "tokens": float(sum(approx_tokens(h.content) for h in hits))}


async def _ask(service: MemoryService, dataset: Dataset, corpus: LoadedCorpus, k: int, as_of: bool,
               progress: _Progress, *, dataset_name: str, embedder_name: str, granularity: str,
               prompt: bool = False, negatives: bool = False) -> RunResult:
    """Every question in every mode against the loaded index; ``as_of`` hides what was said
    from each question's moment on. ``prompt`` also asks recall into a prompt (recall has no
    ``before``: it is asked over the whole history, at the question's moment)."""
    rows: dict[str, list[tuple[str, dict[str, float]]]] = {m: [] for m in MODES}
    ran_as: dict[str, dict[str, int]] = {m: defaultdict(int) for m in MODES}
    reasons: dict[str, set[str]] = {m: set() for m in MODES}
    per_question: list[dict[str, Any]] = []
    fetch = max(k, 10)
    moments = question_moments(dataset)
    prompt_rows: list[tuple[str, dict[str, float]]] = []
    recall_ms: list[float] = []       # each recall into a prompt, end to end
    rerank_ms: list[float] = []       # the hybrid searches' re-rank step, where it ran
    negative_rows: list[tuple[str, dict[str, float]]] = []
    negative_ms: list[float] = []
    pairs = negative_pairs(dataset) if negatives else {}
    reranked: list[float] = []        # and how many candidates it read
    turn_text = {t.id: t.text for c in dataset.conversations for s in c.sessions for t in s.turns}
    for qi, q in enumerate(dataset.questions):
        user = corpus.users[q.conversation]
        moment = moments[qi]
        # Time phrases count back from when the question was asked; as_of also hides
        # everything said from then on, as a live assistant would meet the question.
        before = moment.isoformat() if as_of and moment is not None else None
        entry: dict[str, Any] = {"question": q.question, "category": q.category,
                                 "evidence": list(q.evidence), "modes": {}}
        for mode in MODES:
            response = await service.search(user, q.question, k=fetch, mode=mode, before=before,
                                            now=moment)
            ran_as[mode][response.mode] += 1
            if mode == "hybrid" and "rerankMs" in response.timings_ms:
                rerank_ms.append(response.timings_ms["rerankMs"])
                reranked.append(response.timings_ms.get("reranked", float(len(response.results))))
            if response.fallback_reason:
                reasons[mode].add(response.fallback_reason)
            hits = response.results[:k]
            ranked = [hits_to_turns(h, corpus.line_map) for h in hits]
            scores = score_question(ranked, q.evidence, [h.content for h in hits])
            rows[mode].append((q.category, scores))
            entry["modes"][mode] = {"ran": response.mode, "ranked": ranked, **scores}
        if prompt:
            started = time.perf_counter()
            recalled = await service.recall(user, q.question[:RECALL_QUERY_CHARS], k=RECALL_K,
                                            now=moment)
            recall_ms.append((time.perf_counter() - started) * 1000)
            scores = prompt_scores(recalled, corpus.line_map, turn_text, q.evidence)
            prompt_rows.append((q.category, scores))
            entry["prompt"] = {"ranked": [hits_to_turns(h, corpus.line_map) for h in recalled],
                               **scores}
        if negatives:
            other = pairs[q.conversation]
            started = time.perf_counter()
            noise = await service.recall(corpus.users[other], q.question[:RECALL_QUERY_CHARS],
                                         k=RECALL_K, now=moment)
            negative_ms.append((time.perf_counter() - started) * 1000)
            scores = negative_scores(noise)
            negative_rows.append((q.category, scores))
            entry["negative"] = {"askedIn": other, **scores}
        per_question.append(entry)
        progress(f"asking{' (as of)' if as_of else ''}: "
                 f"{qi + 1}/{len(dataset.questions)} questions")
    progress(f"asked: {len(dataset.questions)} questions × {len(MODES)} modes", final=True)

    modes_out: dict[str, Any] = {}
    for mode in MODES:
        by_cat: dict[str, list[dict[str, float]]] = defaultdict(list)
        for cat, scores in rows[mode]:
            by_cat[cat].append(scores)
        modes_out[mode] = {
            "overall": _mean([s for _, s in rows[mode]]),
            "by_category": {cat: _mean(by_cat[cat]) for cat in sorted(by_cat)},
        }
    report = {
        "dataset": dataset_name,
        "embedder": embedder_name,
        "granularity": granularity,
        "asOf": as_of,
        "questions": len(dataset.questions),
        "modes": modes_out,
    }
    if rerank_ms:
        report["rerank"] = {"searches": len(rerank_ms), "ms": _percentiles(rerank_ms),
                            "candidates": _percentiles(reranked)}
    if prompt:
        prompt_by_cat: dict[str, list[dict[str, float]]] = defaultdict(list)
        for cat, scores in prompt_rows:
            prompt_by_cat[cat].append(scores)
        report["prompt"] = {
            "k": RECALL_K, "budgetTokens": service.config.recall_budget_tokens,
            "ms": _percentiles(recall_ms),
            "overall": _mean([s for _, s in prompt_rows], PROMPT_METRICS),
            "by_category": {cat: _mean(prompt_by_cat[cat], PROMPT_METRICS)
                            for cat in sorted(prompt_by_cat)},
        }
    if negatives:
        negative_by_cat: dict[str, list[dict[str, float]]] = defaultdict(list)
        for cat, scores in negative_rows:
            negative_by_cat[cat].append(scores)
        report["negatives"] = {
            "pairing": NEGATIVE_PAIRING, "questions": len(negative_rows), "k": RECALL_K,
            "ms": _percentiles(negative_ms),
            "overall": _mean([s for _, s in negative_rows], NEGATIVE_METRICS),
            "by_category": {cat: _mean(negative_by_cat[cat], NEGATIVE_METRICS)
                            for cat in sorted(negative_by_cat)},
        }
    return RunResult(report, {m: dict(v) for m, v in ran_as.items()}, reasons, 0,
                     corpus.transcripts, corpus.turns, "", {}, per_question)


# --- output ------------------------------------------------------------------------------------


def format_table(result: RunResult) -> str:
    """A readable table: one row per mode and category, one column per metric."""
    report = result.report
    lines = [
        f"dataset {report['dataset']}: {report['questions']} questions, {result.turns} turns, "
        f"{result.transcripts} transcripts, {result.chunks} chunks",
        f"embedder {report['embedder']} ({result.embedder_reason}); granularity "
        f"{report['granularity']}"
        + ("; as of each question's time" if report.get('asOf') else ""),
        f"time: load {result.seconds.get('load', 0):.1f} s, "
        f"index {result.seconds.get('index', 0):.1f} s, "
        f"search {result.seconds.get('search', 0):.1f} s",
    ]
    for mode in MODES:
        actual = result.ran_as.get(mode, {})
        if set(actual) != {mode}:
            ran = ", ".join(f"{m} ×{n}" for m, n in sorted(actual.items()))
            why = "; ".join(sorted(result.fallback_reasons.get(mode, ()))) or "no reason given"
            lines.append(f"NOTE: {mode} requested, ran as {ran} ({why})")
    header = f"{'mode':<8} {'category':<14}" + "".join(f"{m:>10}" for m in METRICS)
    lines += ["", header, "-" * len(header)]
    for mode in MODES:
        block = report["modes"][mode]
        label = mode if set(result.ran_as.get(mode, {mode: 1})) == {mode} else f"{mode}*"
        rows = [("overall", block["overall"])] + list(block["by_category"].items())
        for i, (cat, values) in enumerate(rows):
            cells = "".join(
                f"{values[m]:>10.0f}" if m.startswith("tokens") else f"{values[m]:>10.3f}"
                for m in METRICS)
            lines.append(f"{label if i == 0 else '':<8} {cat:<14}{cells}")
        lines.append("")
    if "rerank" in report:
        ms, read = report["rerank"]["ms"], report["rerank"]["candidates"]
        lines.append(f"hybrid re-rank step ran in {report['rerank']['searches']} of "
                     f"{report['questions']} searches: p50 {ms['p50']:.0f} ms, p99 {ms['p99']:.0f} "
                     f"ms, max {ms['max']:.0f} ms; candidates read p50 {read['p50']:.0f}, "
                     f"p99 {read['p99']:.0f}")
        lines.append("")
    if "prompt" in report:
        block = report["prompt"]
        lines.append(f"recall into a prompt (MemoryService.recall, k {block['k']}, "
                     f"budget {block['budgetTokens']} tokens; p50 {block['ms']['p50']:.0f} ms, "
                     f"p99 {block['ms']['p99']:.0f} ms):")
        header = f"{'':<8} {'category':<14}" + "".join(f"{m:>15}" for m in PROMPT_METRICS)
        lines += [header, "-" * len(header)]
        for i, (cat, values) in enumerate([("overall", block["overall"])]
                                          + list(block["by_category"].items())):
            cells = "".join(f"{values[m]:>15.0f}" if m == "prompt-tokens" else f"{values[m]:>15.3f}"
                            for m in PROMPT_METRICS)
            lines.append(f"{'prompt' if i == 0 else '':<8} {cat:<14}{cells}")
        lines.append("")
    if "negatives" in report:
        block = report["negatives"]
        lines.append(f"negatives: recall asked in an index lacking the question's conversation "
                     f"({block['questions']} questions; p50 {block['ms']['p50']:.0f} ms, "
                     f"p99 {block['ms']['p99']:.0f} ms):")
        header = f"{'':<8} {'category':<14}" + "".join(f"{m:>15}" for m in NEGATIVE_METRICS)
        lines += [header, "-" * len(header)]
        for i, (cat, values) in enumerate([("overall", block["overall"])]
                                          + list(block["by_category"].items())):
            cells = "".join(f"{values[m]:>15.3f}" if m == "any-recalled" else f"{values[m]:>15.1f}"
                            for m in NEGATIVE_METRICS)
            lines.append(f"{'negative' if i == 0 else '':<8} {cat:<14}{cells}")
        lines.append("")
    if any(set(result.ran_as.get(m, {m: 1})) != {m} for m in MODES):
        lines.append("* this mode fell back to another (see NOTE above); its figures are "
                     "that mode's")
    return "\n".join(lines).rstrip() + "\n"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python bench/recall.py",
        description="Retrieval quality of memory.search on a conversation dataset (see "
                    "bench/README.md).")
    parser.add_argument("dataset", type=Path, help="dataset JSON (conversations + questions)")
    parser.add_argument("--embedder", choices=("auto", "local", "openai", "none"), default="none",
                        help="embedder for the vector leg (default: none, keyword only)")
    parser.add_argument("--granularity", choices=("chunk", "turn"), default="chunk",
                        help="chunk: the configured chunking; turn: exactly one turn per chunk")
    parser.add_argument("--k", type=int, default=10, help="results taken per search (default 10)")
    parser.add_argument("--rrf-k", type=int, default=60, help="RRF constant (default 60)")
    parser.add_argument("--candidates", type=int, default=50,
                        help="candidates per leg (default 50)")
    parser.add_argument("--chunk-tokens", type=int, default=None,
                        help="chunk size for --granularity chunk (default: sized for the "
                             "embedder, ≤ 256)")
    parser.add_argument("--overlap-tokens", type=int, default=None,
                        help="chunk overlap for --granularity chunk (default: "
                             "memory default, chunk/5)")
    parser.add_argument("--fusion", choices=("convex", "rrf"), default=None,
                        help="how hybrid fuses the legs (default: the memory default)")
    parser.add_argument("--fusion-depth", type=int, default=None, metavar="N",
                        help="convex fusion scales each leg between its best and its N-th score "
                             "(default: memory.fusion_depth; the number of candidates = round "
                             "2's min-max)")
    parser.add_argument("--keyword-weight", type=float, default=None,
                        help="keyword leg's weight in hybrid fusion (default: the memory default)")
    parser.add_argument("--keyword-common", type=float, nargs=2, default=None,
                        metavar=("SHARE", "MIN"),
                        help="keyword_common_share and keyword_common_min_chunks (default: "
                             "the memory defaults; 0 0 keeps every word)")
    parser.add_argument("--rerank", choices=("auto", "true", "false"), default=None,
                        help="memory.rerank (default: the memory default, auto)")
    parser.add_argument("--rerank-budget-ms", type=int, default=None,
                        help="memory.rerank_budget_ms (default: the memory default)")
    parser.add_argument("--neighbours", choices=("on", "off"), default=None,
                        help="memory.recall_neighbours: --recall widens excerpts by the message "
                             "before and after (default: the memory default, on)")
    parser.add_argument("--recall-margin", type=float, default=None, metavar="COSINE",
                        help="memory.recall_vector_only_margin: how far above the floor a recalled "
                             "hit that shares no meaningful word with the question must be "
                             "(default: the memory default)")
    parser.add_argument("--as-of", action="store_true",
                        help="ask each question as of when it was asked (its date or "
                             "asked_before_turn): only what was said before it is searched")
    parser.add_argument("--conversations", default=None, metavar="ID,ID",
                        help="only these conversations and their questions (a quicker run)")
    parser.add_argument("--embedding-cache", type=Path, default=None, metavar="FILE",
                        help="keep vectors in FILE across runs (a rerun embeds only new texts)")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite",
                        help="the index to measure (default sqlite; postgres needs --dsn and the "
                             "postgres extra)")
    parser.add_argument("--dsn", default=None,
                        help="postgres: a server DSN; the run creates and drops a scratch "
                             "database on it")
    parser.add_argument("--vector-leg", choices=("hnsw", "bit"), default="hnsw",
                        help="postgres: the vector leg (HNSW, or sign bits + Hamming then "
                             "exact cosine)")
    parser.add_argument("--recall", action="store_true",
                        help="also score what recall into a prompt (the chat's "
                             "MemoryService.recall) puts before the model: the share of evidence "
                             "inside it, and its tokens")
    parser.add_argument("--negatives", action="store_true",
                        help="also ask recall into a prompt for each question in an index that "
                             "lacks its conversation (the next conversation's user): "
                             "the share that gets any excerpt, and the tokens recalled")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT",
                        help="write the figures as JSON")
    parser.add_argument("--details", type=Path, default=None, metavar="OUT",
                        help="write every question's ranked turn ids and scores as JSON")
    return parser


def main(argv: Sequence[str] | None = None, *, stdout: TextIO | None = None,
         stderr: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    out, err = stdout or sys.stdout, stderr or sys.stderr
    if not 1 <= args.k <= 50:
        err.write("--k must be between 1 and 50\n")
        return 2
    try:
        dataset = load_dataset(args.dataset)
        if args.conversations:
            dataset = only_conversations(dataset, args.conversations.split(","))
    except (OSError, DatasetError) as exc:
        err.write(f"error: {exc}\n")
        return 2
    import os

    defaults = MemoryConfig()
    try:
        base = MemoryConfig(
            chunk_tokens=args.chunk_tokens or defaults.chunk_tokens,
            overlap_tokens=(args.overlap_tokens if args.overlap_tokens is not None
                            else defaults.overlap_tokens),
            fusion=args.fusion or defaults.fusion,
            fusion_depth=args.fusion_depth or defaults.fusion_depth,
            keyword_weight=(args.keyword_weight if args.keyword_weight is not None
                            else defaults.keyword_weight),
            keyword_common_share=(args.keyword_common[0] if args.keyword_common
                                  else defaults.keyword_common_share),
            keyword_common_min_chunks=(int(args.keyword_common[1]) if args.keyword_common
                                       else defaults.keyword_common_min_chunks),
            embeddings_api_key=os.environ.get("OPENAI_API_KEY"),
            embeddings_base_url=os.environ.get("OPENAI_BASE_URL"),
            local_threads=os.cpu_count() or 1,
            rerank={"true": True, "false": False, "auto": "auto",
                    None: defaults.rerank}[args.rerank],
            rerank_budget_ms=args.rerank_budget_ms or defaults.rerank_budget_ms,
            recall_neighbours=((args.neighbours == "on") if args.neighbours
                               else defaults.recall_neighbours),
            recall_vector_only_margin=(args.recall_margin if args.recall_margin is not None
                                       else defaults.recall_vector_only_margin),
        )
        if args.backend == "postgres":
            if not args.dsn:
                err.write("--backend postgres needs --dsn\n")
                return 2
            if args.recall or args.negatives:
                err.write("--recall and --negatives score MemoryService.recall (sqlite); "
                          "not measured on postgres yet\n")
                return 2
            from bench.recall_pg import run_postgres_benchmark

            result = asyncio.run(run_postgres_benchmark(
                dataset, dsn=args.dsn, dataset_name=str(args.dataset), embedder_name=args.embedder,
                granularity=args.granularity, k=args.k, rrf_k=args.rrf_k,
                candidates=args.candidates, base_config=base, embedding_cache=args.embedding_cache,
                as_of=args.as_of, vector_leg=args.vector_leg, progress_stream=err))
        else:
            result = asyncio.run(run_benchmark(
                dataset, dataset_name=str(args.dataset), embedder_name=args.embedder,
                granularity=args.granularity, k=args.k, rrf_k=args.rrf_k,
                candidates=args.candidates, base_config=base, progress_stream=err, as_of=args.as_of,
                embedding_cache=args.embedding_cache, prompt=args.recall, negatives=args.negatives))
    except (ValueError, RuntimeError) as exc:
        err.write(f"error: {exc}\n")
        return 2
    out.write(format_table(result))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.report, indent=2) + "\n", encoding="utf-8")
    if args.details is not None:
        args.details.parent.mkdir(parents=True, exist_ok=True)
        args.details.write_text(json.dumps(result.per_question, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    from gateway.logs import configure_logging

    configure_logging("warning")
    raise SystemExit(main())
