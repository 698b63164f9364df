"""bench/conversation.py: a tiny dataset replayed through the real gateway and the fake model
(keyword search only, so it runs in seconds); no timing is asserted."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from bench import conversation
from bench.conversation import (
    PLACES,
    SUMMARY_CLOSE,
    SUMMARY_OPEN,
    PromptParts,
    evidence_places,
    recalled_excerpts,
    run_conversation_benchmark,
    split_prompt,
    turn_in_excerpt,
)
from bench.recall import Turn, dataset_from_json
from gateway.chat.prompt import fenced, format_recall_block
from memory.retrieval.request import SearchHit


def tiny() -> dict[str, Any]:
    """Two conversations; each question's evidence is its conversation's last turns, so in the
    one-session replay it sits in the history window."""
    return {
        "conversations": [
            {"id": "ann", "sessions": [
                {"id": "s1", "date": "2024-05-01T10:00:00", "turns": [
                    {"id": "a1", "speaker": "Ann",
                     "text": "I adopted a kitten called Pepper today"},
                    {"id": "a2", "speaker": "Bo", "text": "lovely, what colour is she"},
                ]},
                {"id": "s2", "date": "2024-05-09T18:00:00", "turns": [
                    {"id": "a3", "speaker": "Ann", "text": "my violin exam is on Friday morning"},
                    {"id": "a4", "speaker": "Bo", "text": "good luck with the violin exam"},
                ]},
            ]},
            {"id": "cy", "sessions": [
                {"id": "s1", "date": "2024-06-01T09:00:00", "turns": [
                    {"id": "c1", "speaker": "Cy",
                     "text": "the bakery on Elm street sells rye bread"},
                    {"id": "c2", "speaker": "Di",
                     "text": "their violin shaped cookies are famous too"},
                ]},
            ]},
        ],
        "questions": [
            {"conversation": "ann", "question": "When is the violin exam?", "evidence": ["a3"],
             "category": "single-hop"},
            {"conversation": "cy", "question": "What cookies are famous at the bakery?",
             "evidence": ["c2"], "category": "single-hop"},
        ],
    }


async def test_replay_counts_history_and_negatives() -> None:
    dataset = dataset_from_json(tiny())
    report = await run_conversation_benchmark(dataset, dataset_name="tiny", embedder="none",
                                              warmup=0)
    assert set(report["modes"]) == {"one-session", "separate"}
    one = report["modes"]["one-session"]
    # The question is asked right after the replayed conversation: its evidence is in the window.
    assert one["evidence"]["overall"]["history"] == 1.0
    assert one["evidence"]["overall"]["any"] == 1.0
    assert one["questions"] == 2
    separate = report["modes"]["separate"]
    # A new session holds no history: whatever reached the prompt came through recall.
    assert separate["evidence"]["overall"]["history"] == 0.0
    assert separate["evidence"]["overall"]["summary"] == 0.0
    for block in (one, separate):
        neg = block["negatives"]
        assert neg["questions"] == 2
        assert 0.0 <= neg["anyRecalled"] <= 1.0
        assert neg["tokens"] >= 0.0
        assert block["promptTokens"]["mean"] > 0
        assert block["recallCalls"] >= 1  # the gateway's own recall ran and was timed
    # Negatives: each question asked as the other conversation's user, none scored for evidence.
    negatives = [q for q in report["perQuestion"] if q["negative"]]
    assert {(q["conversation"], q["askedAs"]) for q in negatives} == {("ann", "cy"), ("cy", "ann")}
    assert all(q["any"] == 0.0 for q in negatives)
    # "violin" is in cy's conversation too: ann's question asked in cy's index recalls it (keyword).
    ann_in_cy = next(q for q in negatives if q["conversation"] == "ann" and q["mode"] == "separate")
    assert ann_in_cy["excerpts"] >= 1 and ann_in_cy["recalledTokens"] > 0
    got = sum(1 for q in negatives if q["mode"] == "separate" and q["excerpts"]) / 2
    assert separate["negatives"]["anyRecalled"] == got


def test_cli_json_has_documented_fields(tmp_path: Path) -> None:
    data = tmp_path / "tiny.json"
    data.write_text(json.dumps(tiny()), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    code = conversation.main([str(data), "--embedder", "none", "--modes", "separate",
                              "--json", str(tmp_path / "out.json")], stdout=out, stderr=err)
    assert code == 0, err.getvalue()
    report = json.loads((tmp_path / "out.json").read_text(encoding="utf-8"))
    for key in ("dataset", "embedder", "granularity", "granularityNote", "conversations",
                "questions", "turns", "negatives", "summaryTag", "warmup", "compaction", "modes",
                "perQuestion"):
        assert key in report
    block = report["modes"]["separate"]
    for key in ("questions", "evidence", "promptTokens", "recalledTokens", "recalledExcerpts",
                "recallMs", "recallCalls", "firstDeltaMs", "chunks", "seconds", "negatives"):
        assert key in block
    assert set(block["evidence"]["overall"]) == {*PLACES, "any", "all", "questions"}
    assert set(block["negatives"]) >= {"questions", "anyRecalled", "excerpts", "tokens"}
    assert "negatives" in out.getvalue() and "history" in out.getvalue()


def test_cli_refuses_turn_granularity(tmp_path: Path) -> None:
    data = tmp_path / "tiny.json"
    data.write_text(json.dumps(tiny()), encoding="utf-8")
    err = io.StringIO()
    assert conversation.main([str(data), "--granularity", "turn"], stdout=io.StringIO(),
                             stderr=err) == 2
    assert "does not apply" in err.getvalue()


def _hit(content: str) -> SearchHit:
    return SearchHit(chunk_id=1, session_key="0" * 32, content=content, score=1.0, line_start=2,
                     line_end=2, start_ts="2024-05-01T10:00:00Z", end_ts=None, keyword_rank=1,
                     vector_rank=None)


def test_prompt_reading() -> None:
    turns = [Turn("a1", "Ann", "I adopted a kitten called Pepper today"),
             Turn("a2", "Bo", 'lovely, "what" colour is she & why'),
             Turn("a3", "Ann", "my violin exam is on Friday morning " + "and then " * 30 + "lunch")]
    block = format_recall_block([_hit("Ann [2024-05-01T10:00:00Z]: I adopted a kitten called "
                                      "<Pepper> today")])
    assert recalled_excerpts(block) == [
        "Ann [2024-05-01T10:00:00Z]: I adopted a kitten called <Pepper> today"]
    system = (format_recall_block([_hit("Ann [2024-05-01T10:00:00Z]: I adopted a kitten called "
                                        "Pepper today")])
              + "\n\n" + fenced(SUMMARY_OPEN, "A summary.",
                                [("earlier", 'Bo said: lovely, "what" colour is she & why')],
                                SUMMARY_CLOSE))
    parts = split_prompt([{"role": "system", "content": system},
                          {"role": "user",
                           "content": "my violin exam is on Friday morning " + "and then " * 30
                           + "lunch"},
                          {"role": "user", "content": "When is it?"}], "When is it?")
    assert parts.history == ("my violin exam is on Friday morning " + "and then " * 30 + "lunch",)
    assert parts.tokens > 0
    found = evidence_places(parts, turns)
    assert found == {"history": {"a3"}, "summary": {"a2"}, "recall": {"a1"}}
    # A cut excerpt holds a turn whose opening survived; a bare word match is not a turn.
    assert turn_in_excerpt(turns[2].text,
                           "Ann [ts]: my violin exam is on Friday morning and then and …")
    assert not turn_in_excerpt("Pepper", "Ann [ts]: I adopted a kitten called Pepper today")
    assert evidence_places(PromptParts((), "", (), 0), turns) == {p: set() for p in PLACES}
    # A summary section that is not in quoted rows is read as it stands.
    raw = split_prompt([{"role": "system",
                         "content": f"{SUMMARY_OPEN}\nAnn: I adopted a kitten called Pepper "
                                    f"today\n{SUMMARY_CLOSE}"},
                        {"role": "user", "content": "q"}], "q")
    assert evidence_places(raw, turns)["summary"] == {"a1"}
