"""Tests for the retrieval-quality harness (bench/recall.py), keyword-only on tiny datasets."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import apsw
import orjson
import pytest

from bench import recall
from bench.recall import (
    METRICS,
    MODES,
    DatasetError,
    dataset_from_json,
    hit_at,
    hits_to_turns,
    load_corpus,
    mrr,
    ndcg_at,
    recall_at,
    run_benchmark,
    score_question,
)

LONG_TEXT = " ".join(f"word{i}" for i in range(500))  # ~1000 approximate tokens


def tiny_dataset() -> dict[str, Any]:
    return {
        "conversations": [
            {"id": "ann & bo", "sessions": [
                {"id": "s1", "date": "2024-05-01", "turns": [
                    {"id": "a1", "speaker": "Ann",
                     "text": "I adopted a kitten called Pepper today"},
                    {"id": "a2", "speaker": "Bo", "text": "lovely, what colour is she"},
                    {"id": "a3", "speaker": "Ann", "text": "grey with one white paw"},
                ]},
                {"id": "s2", "date": "2024-05-09T18:00:00", "turns": [
                    {"id": "a4", "speaker": "Bo", "text": "my violin exam is on Friday"},
                    {"id": "a5", "speaker": "Ann", "text": LONG_TEXT},
                ]},
            ]},
            {"id": "cy", "sessions": [
                {"id": "s1", "date": "2024-06-01T09:00:00+02:00", "turns": [
                    {"id": "c1", "speaker": "Cy",
                     "text": "the kitten next door is called Pepper too"},
                    {"id": "c2", "speaker": "Di", "text": "what a coincidence"},
                ]},
            ]},
        ],
        "questions": [
            {"conversation": "ann & bo", "question": "What is the kitten called?",
             "evidence": ["a1"], "category": "single-hop"},
            {"conversation": "ann & bo",
             "question": "When is the violin exam and what colour is Pepper?",
             "evidence": ["a4", "a3"], "category": "multi-hop"},
            {"conversation": "cy", "question": "kitten Pepper", "evidence": ["c1"]},
        ],
    }


# --- metrics -----------------------------------------------------------------------------------


def test_recall_at_counts_evidence_turns_covered_within_k() -> None:
    """Recall@k is the fraction of distinct evidence turns found in the first k results."""
    ranked = [["x"], ["a", "y"], ["z"], ["b"]]
    assert recall_at(ranked, ["a", "b"], 1) == 0.0
    assert recall_at(ranked, ["a", "b"], 2) == 0.5
    assert recall_at(ranked, ["a", "b"], 4) == 1.0
    assert recall_at(ranked, ["a", "b", "c", "d"], 10) == 0.5
    assert recall_at([], ["a"], 5) == 0.0


def test_hit_at_is_one_when_any_evidence_turn_is_in_the_top_k() -> None:
    """Hit@k is 1.0 as soon as one evidence turn is covered within k, else 0.0."""
    ranked = [["x"], ["y"], ["b"]]
    assert hit_at(ranked, ["a", "b"], 2) == 0.0
    assert hit_at(ranked, ["a", "b"], 3) == 1.0


def test_mrr_is_the_reciprocal_rank_of_the_first_covering_result() -> None:
    """MRR is 1/rank of the first result covering any evidence turn, 0.0 when none does."""
    assert mrr([["x"], ["y"], ["a", "q"], ["b"]], ["a", "b"]) == pytest.approx(1 / 3)
    assert mrr([["a"]], ["a"]) == 1.0
    assert mrr([["x"], ["y"]], ["a"]) == 0.0


def test_ndcg_gives_each_evidence_turn_gain_at_its_first_rank() -> None:
    """nDCG@k matches a hand computation: evidence at ranks 2 and 4 against an ideal of ranks 1
    and 2."""
    ranked = [["x"], ["a"], ["y"], ["b", "a"]]
    dcg = 1 / math.log2(3) + 1 / math.log2(5)
    ideal = 1 / math.log2(2) + 1 / math.log2(3)
    assert ndcg_at(ranked, ["a", "b"], 10) == pytest.approx(dcg / ideal)
    assert ndcg_at(ranked, ["a", "b"], 3) == pytest.approx((1 / math.log2(3)) / ideal)
    assert ndcg_at([["a"], ["b"]], ["a", "b"], 10) == pytest.approx(1.0)


def test_ndcg_is_capped_at_one_when_one_chunk_holds_several_evidence_turns() -> None:
    """A single first result covering all evidence scores exactly 1.0, not more."""
    assert ndcg_at([["a", "b", "c"]], ["a", "b", "c"], 10) == 1.0


def test_score_question_counts_tokens_with_the_chunkers_rule() -> None:
    """tokens@5 and tokens@10 sum memory.chunking.approx_tokens over the returned texts."""
    contents = ["abcdefgh"] * 12  # 2 approximate tokens each
    scores = score_question([["x"]] * 12, ["a"], contents)
    assert set(scores) == set(METRICS)
    assert scores["tokens@5"] == 10.0 and scores["tokens@10"] == 20.0


# --- loading and mapping -----------------------------------------------------------------------


def test_hits_to_turns_maps_line_ranges_and_skips_the_header() -> None:
    """A chunk's line range maps to the turn ids of its lines; the header line maps to nothing."""
    line_map = {("k1", 2): "t1", ("k1", 3): "t2", ("k1", 4): "t3", ("k2", 2): "u1"}
    hit = SimpleNamespace(session_key="k1", line_start=1, line_end=3)
    assert hits_to_turns(hit, line_map) == ["t1", "t2"]
    assert hits_to_turns(SimpleNamespace(session_key="k2", line_start=2, line_end=2),
                         line_map) == ["u1"]


def test_load_corpus_line_map_points_at_the_right_transcript_lines(tmp_path: Path) -> None:
    """Every (session key, line) in the map is the transcript line holding that turn, with name
    and date."""
    dataset = dataset_from_json(tiny_dataset())
    corpus = load_corpus(dataset, tmp_path, "chunk")
    turns = {t.id: t for c in dataset.conversations for s in c.sessions for t in s.turns}
    assert corpus.transcripts == 3 and corpus.turns == len(turns) == len(corpus.line_map)
    for (key, line), turn_id in corpus.line_map.items():
        conv = next(c for c in dataset.conversations
                    if any(t.id == turn_id for s in c.sessions for t in s.turns))
        path = tmp_path / "sessions" / corpus.users[conv.id] / f"{key}.jsonl"
        obj = orjson.loads(path.read_bytes().splitlines()[line - 1])
        assert obj["content"] == turns[turn_id].text and obj["name"] == turns[turn_id].speaker
    first = tmp_path / "sessions" / corpus.users["ann & bo"]
    lines = [orjson.loads(x) for p in first.glob("*.jsonl") for x in p.read_bytes().splitlines()]
    stamps = sorted(x["ts"] for x in lines if x["type"] == "message")
    assert stamps[:3] == ["2024-05-01T00:00:00.000Z", "2024-05-01T00:01:00.000Z",
                          "2024-05-01T00:02:00.000Z"]
    roles = {x["name"]: x["role"] for x in lines if x["type"] == "message"}
    assert roles == {"Ann": "user", "Bo": "assistant"}


def test_dataset_errors_name_the_bad_field() -> None:
    """An evidence id that is not a turn of the question's conversation is refused with its path."""
    data = tiny_dataset()
    data["questions"][0]["evidence"] = ["c1"]
    with pytest.raises(DatasetError, match=r"questions\[0\]\.evidence"):
        dataset_from_json(data)
    data = tiny_dataset()
    data["conversations"][0]["sessions"][0]["date"] = "May 1st"
    with pytest.raises(DatasetError, match="not ISO-8601"):
        dataset_from_json(data)


# --- runs --------------------------------------------------------------------------------------


async def test_turn_granularity_indexes_exactly_one_whole_turn_per_chunk(tmp_path: Path) -> None:
    """With --granularity turn every chunk is one whole message, even one longer than
    chunk_tokens."""
    dataset = dataset_from_json(tiny_dataset())
    result = await run_benchmark(dataset, dataset_name="tiny", granularity="turn",
                                 data_dir=tmp_path)
    assert result.chunks == result.turns == 7
    db = apsw.Connection(str(tmp_path / "memory.db"))
    rows = db.execute("SELECT line_start, line_end, content FROM chunks").fetchall()
    assert len(rows) == 7 and all(start == end == 2 for start, end, _ in rows)
    assert any(str(content).endswith(LONG_TEXT) for _, _, content in rows)
    db.close()
    for entry in result.per_question:
        assert all(len(turns) == 1 for mode in entry["modes"].values() for turns in mode["ranked"])


async def test_as_of_searches_only_what_was_said_before_the_question(tmp_path: Path) -> None:
    """--as-of hides turns from the question's moment on: asked before a4, the a4 evidence is
    unreachable."""
    data = tiny_dataset()
    data["questions"] = [{"conversation": "ann & bo", "question": "violin exam", "evidence": ["a4"],
                          "asked_before_turn": "a4"}]
    dataset = dataset_from_json(data)
    plain = await run_benchmark(dataset, dataset_name="tiny", granularity="turn")
    as_of = await run_benchmark(dataset, dataset_name="tiny", granularity="turn", as_of=True)
    assert plain.report["modes"]["keyword"]["overall"]["recall@10"] == 1.0
    assert as_of.report["modes"]["keyword"]["overall"]["recall@10"] == 0.0
    assert as_of.report["asOf"] is True


async def test_chunk_granularity_maps_multi_turn_chunks_to_their_turns(tmp_path: Path) -> None:
    """With the default chunking a session's turns share a chunk and a hit covers all of them."""
    dataset = dataset_from_json(tiny_dataset())
    result = await run_benchmark(dataset, dataset_name="tiny", granularity="chunk",
                                 data_dir=tmp_path)
    first = result.per_question[0]["modes"]["keyword"]
    assert first["ranked"][0] == ["a1", "a2", "a3"]
    assert first["recall@5"] == 1.0 and first["mrr"] == 1.0
    third = result.per_question[2]["modes"]["keyword"]
    assert third["ranked"] == [["c1", "c2"]]  # scoped to its own user: ann's Pepper is not returned


def test_cli_writes_the_documented_json_shape_and_reports_fallbacks(tmp_path: Path) -> None:
    """The --json file has exactly the documented keys; embedder none says vector/hybrid ran as
    keyword."""
    data_path = tmp_path / "tiny.json"
    data_path.write_text(json.dumps(tiny_dataset()))
    out_path = tmp_path / "out" / "figures.json"
    stdout, stderr = io.StringIO(), io.StringIO()
    rc = recall.main([str(data_path), "--embedder", "none", "--granularity", "turn", "--json",
                      str(out_path)], stdout=stdout, stderr=stderr)
    assert rc == 0, stderr.getvalue()
    report = json.loads(out_path.read_text())
    assert set(report) == {"dataset", "embedder", "granularity", "asOf", "questions", "modes"}
    assert (report["dataset"], report["embedder"], report["granularity"], report["questions"]) == (
        str(data_path), "none", "turn", 3)
    assert set(report["modes"]) == set(MODES)
    for block in report["modes"].values():
        assert set(block) == {"overall", "by_category"}
        assert set(block["overall"]) == set(METRICS)
        assert set(block["by_category"]) == {"single-hop", "multi-hop", "uncategorized"}
        assert all(set(values) == set(METRICS) for values in block["by_category"].values())
    table = stdout.getvalue()
    assert ("vector requested, ran as keyword" in table
            and "hybrid requested, ran as keyword" in table)
    assert "recall@5" in table and "loading:" in stderr.getvalue()


def test_cli_rejects_a_missing_dataset_and_too_few_candidates(tmp_path: Path) -> None:
    """Bad input ends with exit status 2 and a one-line error, no traceback."""
    err = io.StringIO()
    assert recall.main([str(tmp_path / "nope.json")], stdout=io.StringIO(), stderr=err) == 2
    assert err.getvalue().startswith("error:")
    data_path = tmp_path / "tiny.json"
    data_path.write_text(json.dumps(tiny_dataset()))
    err = io.StringIO()
    assert recall.main([str(data_path), "--k", "20", "--candidates", "10"], stdout=io.StringIO(),
                       stderr=err) == 2
    assert "--candidates" in err.getvalue()


def test_the_shipped_sample_dataset_is_valid_and_big_enough() -> None:
    """bench/data/sample.json parses and has 5+ conversations of 3+ sessions and 60+ categorised
    questions, the relative-time ones dated (their "last week" needs a moment to count back
    from)."""
    path = Path(recall.__file__).parent / "data" / "sample.json"
    dataset = recall.load_dataset(path)
    assert len(dataset.conversations) >= 5 and all(len(c.sessions) >= 3
                                                   for c in dataset.conversations)
    assert len(dataset.questions) >= 60
    assert {q.category for q in dataset.questions} == {"single-hop", "multi-hop", "temporal",
                                                       "relative-time"}
    assert all(q.date is not None for q in dataset.questions if q.category == "relative-time")


def test_prompt_scores_count_a_cut_excerpts_turn_only_when_its_opening_survived() -> None:
    """An excerpt the token budget cut holds only the turns whose opening words are still in it."""
    line_map = {("s", 2): "t1", ("s", 3): "t2"}
    texts = {"t1": "the kitten is called Pepper", "t2": "my violin exam is on Friday"}
    whole = SimpleNamespace(session_key="s", line_start=2, line_end=3,
                            content="x: the kitten is called Pepper\n"
                                    "y: my violin exam is on Friday")
    cut = SimpleNamespace(session_key="s", line_start=2, line_end=3,
                          content="x: the kitten is called Pepper …")
    assert recall.prompt_scores([whole], line_map, texts, ["t1", "t2"])["prompt-all"] == 1.0  # type: ignore[list-item]
    scores = recall.prompt_scores([cut], line_map, texts, ["t1", "t2"])  # type: ignore[list-item]
    assert (scores["prompt-recall"] == 0.5 and scores["prompt-all"] == 0.0
            and scores["prompt-tokens"] > 0)


async def test_prompt_recall_scores_what_the_chats_recall_returns(tmp_path: Path) -> None:
    """With prompt on, each question is also asked through MemoryService.recall and the report has
    a per-category prompt block; the as-of view, which recall cannot narrow, has none."""
    dataset = dataset_from_json(tiny_dataset())
    result = await run_benchmark(dataset, dataset_name="tiny", granularity="turn", prompt=True,
                                 also_as_of=True)
    block = result.report["prompt"]
    assert set(block["overall"]) == set(recall.PROMPT_METRICS) and block["k"] == recall.RECALL_K
    assert result.per_question[0]["prompt"]["ranked"][0] == ["a1"]
    assert result.per_question[0]["prompt"]["prompt-recall"] == 1.0
    assert ("single-hop" in block["by_category"]
            and "recall into a prompt" in recall.format_table(result))
    assert result.as_of is not None and "prompt" not in result.as_of.report
