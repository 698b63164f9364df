"""The memory settings: one frozen value built by the gateway's config loader.

Library code receives a :class:`MemoryConfig`; it never reads the environment. Every field
below has its ``[memory]`` key of the same name in ``config.example.toml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CHUNK_TOKENS_CAP", "RETRY_MAX_S", "EmbedderChoice", "FactsMode", "FusionMethod",
           "MemoryConfig", "SizedConfig"]

# The largest automatic chunk (approximate tokens). Ten results of this size stay within about
# 2,000 tokens of prompt, and smaller chunks were worse for keyword recall on every dataset
# (docs/memory.md, "Chunk size").
CHUNK_TOKENS_CAP = 256
# The longest wait between retries of a failed sync (memory.sqlite.index.scheduler doubles up to
# it).
RETRY_MAX_S = 300.0
# An embedder's window is in its own tokens; approx_tokens can undercount WordPiece by ~20%
# and a query/passage prefix takes a few, so an automatic chunk uses 4/5 of the window.
WINDOW_SHARE = 0.8

EmbedderChoice = Literal["auto", "openai", "local", "none"]
FactsMode = Literal["tool", "block", "off"]
FusionMethod = Literal["convex", "rrf"]


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """Settings of the index, the indexer, the embedders and the search."""

    enabled: bool = True
    # "auto": openai when an API key is configured, else local when installed, else none.
    embedder: EmbedderChoice = "auto"

    # Chunking (approximate tokens; see memory.chunking.approx_tokens). None: sized for the
    # active embedder's window, at most CHUNK_TOKENS_CAP (see sized_for).
    chunk_tokens: int | None = None
    overlap_tokens: int | None = None

    # Indexer triggers. A sync that fails (the index's disk full or failing) is retried whole
    # after sync_retry_s, doubled each time up to 300 s (RETRY_MAX_S), without waiting for a new
    # transcript change; 0 leaves it to the next change. Embedder failures are not retried
    # so: each call has its own retries, and the chunks stay keyword-searchable meanwhile.
    debounce_ms: int = 1500
    watch: bool = True
    sync_retry_s: float = 5.0

    # Search. Fusion of the keyword and vector legs (memory.fusion): "convex" adds min-max
    # normalised leg scores weighted keyword_weight : 1 - keyword_weight; "rrf" adds
    # weighted reciprocal ranks with constant rrf_k. Chosen by cross-validation (docs/memory.md).
    fusion: FusionMethod = "convex"
    keyword_weight: float = 0.3
    rrf_k: int = 60
    # "convex" scales each leg between its best score and its fusion_depth-th (lower ones get 0):
    # over all 50 candidates, a keyword leg sure of one short turn drowned the vector leg's order.
    fusion_depth: int = 15
    # Recall into a prompt adds recency_weight · 0.5^(age / half-life) to each fused score, age
    # counted back from now: what was said lately wins near-ties (docs/memory.md has the
    # cross-validation behind the numbers); 0 turns it off. memory.search ranks without it.
    recency_weight: float = 0.2
    recency_half_life_days: float = 60.0
    candidates: int = 50
    # The local cross-encoder (memory.rerank) re-orders the fused top of hybrid and vector
    # searches. "auto": with the local embedder, as many of the top rerank_candidates as fit
    # rerank_budget_ms at the cost measured on this machine, skipped when both legs put the same
    # chunk first; true: all rerank_candidates, whatever it costs; false: fused order
    # (docs/memory.md, "Re-ranking"). Ten: reading the top 15 or 30 let the cross-encoder
    # promote hits from below the tenth into the ten, lowering R@10 on both shared sets' turns.
    rerank: bool | Literal["auto"] = "auto"
    rerank_candidates: int = 10
    rerank_budget_ms: int = 120
    # "auto": a search finding this many others in the re-rank step answers in fused order at
    # once. Concurrent steps share the CPU, so each would read fewer candidates in its budget and
    # all of them would still spend it; under a queue of searches the step backs off.
    rerank_max_concurrent: int = 1
    # A passage longer than this many words is cut to its window holding the most query words.
    rerank_passage_words: int = 96

    # Time phrases in a query ("yesterday", "last week", "in May 2023", memory.timephrases)
    # put what was said in that window first.
    time_phrases: bool = True
    default_k: int = 6
    max_k: int = 50
    max_query_terms: int = 32
    # The keyword leg leaves out a query word found in at least keyword_common_share of all
    # chunks (and at least keyword_common_min_chunks of them) when the query has rarer words:
    # FTS5 scores every row an OR query matches, and BM25 gives such a word little weight
    # (memory.sqlite.common_terms). 0 keeps every word.
    keyword_common_share: float = 0.05
    keyword_common_min_chunks: int = 5000
    # On a user's partition of at least this many chunks, the vector leg's in-memory scan runs
    # on its own thread while the keyword leg runs its SQL (memory.sqlite.search); below it
    # the hand-over costs more than the overlap saves. 0 runs the legs one after the other.
    overlap_min_chunks: int = 50_000
    # Read connections map up to this many MiB of memory.db (PRAGMA mmap_size): row reads become
    # memory accesses instead of read() calls, but every page touched stays in the daemon's RSS
    # — at a million chunks gigabytes of file pages for a millisecond or two per search
    # (docs/scaling.md). 0: off, reads go through SQLite's page cache.
    read_mmap_mb: int = 0

    # Recall into a prompt (memory.recall): excerpts within this many approximate tokens, and
    # only those whose cosine to the message reaches the floor (None: the embedder's own
    # calibrated floor, if it has one). recall_neighbours: the tokens the excerpts leave are
    # spent on the message before and after each, best excerpt first (memory.retrieval.neighbours).
    recall_budget_tokens: int = 1500
    recall_min_similarity: float | None = None
    recall_neighbours: bool = True
    # The floor adapts (memory.retrieval.excerpts.relevant): a hit that shares no meaningful
    # word with the message must clear it by recall_vector_only_margin, and none may fall more
    # than recall_relative_drop below the best hit's cosine.
    recall_vector_only_margin: float = 0.02
    recall_relative_drop: float = 1.0

    # Remembered facts (memory.facts): "tool" offers the model remember/forget/search_memory
    # tools; "block" (models without tool calling) asks for a trailing <memory_update> JSON block,
    # held back from the stream and stripped; "off" neither saves facts nor shows them. A new fact
    # whose cosine to an active one reaches facts_dedup_threshold updates that fact instead of
    # adding a near-duplicate.
    facts: FactsMode = "tool"
    facts_dedup_threshold: float = 0.92
    facts_max_chars: int = 200
    facts_max_per_user: int = 1000
    # Block mode: text after a line-start <memory_update> is held back at most this long (to
    # the end of the closing tag); a longer one is ordinary text and is sent on.
    facts_block_max_chars: int = 4000
    # The "Remembered facts" prompt section: at most this many facts, within this many tokens.
    facts_prompt_max: int = 8
    facts_prompt_budget_tokens: int = 300

    # Retention: chunks whose newest message is older than this many days, and facts not said
    # for as long, are removed by a daily sweep and never re-indexed. 0 keeps everything.
    retention_days: int = 0

    # Episodes (docs/memory.md, "Episodes"): after a run, a 1–2 sentence summary of the
    # conversation, written off the request path by the chat model (or summary_model). A session
    # gets one only after episode_cooldown_turns user messages and episode_cooldown_minutes since
    # its last; a user at most episode_daily_cap a day. A summary whose cosine to a recent
    # episode reaches episode_novelty_threshold is dropped as nothing new; one of the same theme
    # as the user's latest episode within episode_merge_hours is merged into it. A failed summary
    # is retried episode_max_attempts times, waiting episode_retry_s doubled each time.
    episodes: bool = True
    summary_model: str | None = None
    episode_cooldown_turns: int = 4
    episode_cooldown_minutes: float = 30.0
    episode_daily_cap: int = 12
    episode_novelty_threshold: float = 0.95
    episode_merge_hours: float = 6.0
    episode_max_attempts: int = 5
    episode_retry_s: float = 60.0
    # Episodes recalled into a prompt; a message with recall intent ("remember when we…",
    # "what did we talk about last week") gets episode_intent_k and recency weight 0.5.
    episode_recall_k: int = 2
    episode_intent_k: int = 5

    # Privacy: redact e-mails, phone numbers, record numbers in text sent to a remote embedder.
    redact_before_embedding: bool = False

    # Remote (OpenAI-compatible) embedder.
    embeddings_base_url: str | None = None
    embeddings_api_key: str | None = None
    embeddings_model: str = "text-embedding-3-small"
    embeddings_dimensions: int | None = None
    embeddings_batch_size: int = 64
    embeddings_max_batch_chars: int = 200_000
    embeddings_timeout_s: float = 30.0
    embeddings_max_retries: int = 4

    # Local (ONNX) embedder. local_model: a name from memory.embedders.local_embedder.MODELS (None:
    # the default model, else the first installed); local_max_tokens: None is the model's own
    # window; local_threads: None is both cores of a 2-core machine (min(2, cpu_count)).
    local_model: str | None = None
    local_batch_size: int = 16
    local_max_tokens: int | None = None
    local_threads: int | None = None

    def __post_init__(self) -> None:
        problems: list[str] = []
        if self.chunk_tokens is not None and self.chunk_tokens < 16:
            problems.append("chunk_tokens must be at least 16")
        if self.overlap_tokens is not None \
                and not 0 <= self.overlap_tokens < (self.chunk_tokens or CHUNK_TOKENS_CAP):
            problems.append("overlap_tokens must be at least 0 and less than chunk_tokens")
        if self.debounce_ms < 0:
            problems.append("debounce_ms must not be negative")
        if not 0 <= self.sync_retry_s <= RETRY_MAX_S:  # also refuses nan
            problems.append(f"sync_retry_s must be between 0 (no retry) and {RETRY_MAX_S:g}")
        if self.fusion not in ("convex", "rrf"):
            problems.append("fusion must be 'convex' or 'rrf'")
        if not 0.0 <= self.keyword_weight <= 1.0:
            problems.append("keyword_weight must be between 0 and 1")
        if self.rrf_k < 1:
            problems.append("rrf_k must be at least 1")
        if self.fusion_depth < 2:
            problems.append("fusion_depth must be at least 2")
        if not 0.0 <= self.recency_weight <= 1.0:
            problems.append("recency_weight must be between 0 and 1")
        if not self.recency_half_life_days > 0:
            problems.append("recency_half_life_days must be above 0")
        if not 1 <= self.default_k <= self.max_k:
            problems.append("default_k must be between 1 and max_k")
        if self.candidates < self.max_k:
            problems.append("candidates must be at least max_k")
        if self.rerank not in (True, False, "auto"):
            problems.append("rerank must be true, false or 'auto'")
        if self.rerank_candidates < 1:
            problems.append("rerank_candidates must be at least 1")
        if self.rerank_budget_ms < 1:
            problems.append("rerank_budget_ms must be at least 1")
        if self.rerank_max_concurrent < 1:
            problems.append("rerank_max_concurrent must be at least 1")
        if self.rerank_passage_words < 8:
            problems.append("rerank_passage_words must be at least 8")
        if self.recall_budget_tokens < 1:
            problems.append("recall_budget_tokens must be at least 1")
        if self.recall_min_similarity is not None and not -1.0 <= self.recall_min_similarity <= 1.0:
            problems.append("recall_min_similarity must be between -1 and 1")
        for name in ("recall_vector_only_margin", "recall_relative_drop"):
            if not 0.0 <= getattr(self, name) <= 2.0:  # also refuses nan
                problems.append(f"{name} must be between 0 and 2")
        if self.facts not in ("tool", "block", "off"):
            problems.append("facts must be 'tool', 'block' or 'off'")
        if self.facts_block_max_chars < 100:
            problems.append("facts_block_max_chars must be at least 100")
        if not 0.0 < self.facts_dedup_threshold <= 1.0:
            problems.append("facts_dedup_threshold must be above 0 and at most 1")
        for name in ("facts_max_chars", "facts_max_per_user", "facts_prompt_max",
                     "facts_prompt_budget_tokens"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1")
        for name in ("episode_cooldown_turns", "episode_daily_cap", "episode_max_attempts",
                     "episode_intent_k"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1")
        for name in ("episode_cooldown_minutes", "episode_merge_hours", "episode_retry_s"):
            if getattr(self, name) < 0:
                problems.append(f"{name} must not be negative")
        if self.episode_recall_k < 0:
            problems.append("episode_recall_k must not be negative")
        if not 0.0 < self.episode_novelty_threshold <= 1.0:
            problems.append("episode_novelty_threshold must be above 0 and at most 1")
        if self.retention_days < 0:
            problems.append("retention_days must not be negative (0 keeps everything)")
        if not 0.0 <= self.keyword_common_share < 1.0:
            problems.append("keyword_common_share must be from 0 (off) to below 1")
        if self.keyword_common_min_chunks < 0:
            problems.append("keyword_common_min_chunks must not be negative")
        if self.read_mmap_mb < 0:
            problems.append("read_mmap_mb must not be negative (0: no mapping)")
        if self.overlap_min_chunks < 0:
            problems.append("overlap_min_chunks must not be negative (0: legs one after the other)")
        if self.embeddings_dimensions is not None and self.embeddings_dimensions < 1:
            problems.append("embeddings_dimensions must be positive")
        for name in ("embeddings_batch_size", "local_batch_size", "local_max_tokens",
                     "local_threads", "max_query_terms", "embeddings_max_batch_chars"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                problems.append(f"{name} must be at least 1")
        if self.embeddings_max_retries < 0:
            problems.append("embeddings_max_retries must not be negative")
        if self.embeddings_timeout_s <= 0:
            problems.append("embeddings_timeout_s must be positive")
        if problems:
            raise ValueError("memory: " + "; ".join(problems))

    def sized_for(self, window: int | None) -> SizedConfig:
        """These settings with the chunk size settled for an embedder whose input window is
        ``window`` tokens (None: no embedder, or one without a known limit)."""
        chunk = self.chunk_tokens
        if chunk is None:
            chunk = (CHUNK_TOKENS_CAP if window is None
                     else max(16, min(CHUNK_TOKENS_CAP, int(window * WINDOW_SHARE))))
        overlap = self.overlap_tokens if self.overlap_tokens is not None else chunk // 5
        if overlap >= chunk:
            raise ValueError(f"memory: overlap_tokens ({overlap}) must be less than the chunk "
                             f"size ({chunk})")
        return SizedConfig(chunk, overlap)


@dataclass(frozen=True, slots=True)
class SizedConfig:
    """The chunk size in force: what chunking and the index fingerprint use."""

    chunk_tokens: int
    overlap_tokens: int

