"""bench/recall.py --negatives: recall asked in an index lacking the question's conversation."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from bench import recall
from bench.recall import dataset_from_json, negative_pairs, run_benchmark


def tiny() -> dict[str, Any]:
    return {
        "conversations": [
            {"id": "ann", "sessions": [{"id": "s1", "date": "2024-05-01", "turns": [
                {"id": "a1", "speaker": "Ann", "text": "I adopted a kitten called Pepper today"},
                {"id": "a2", "speaker": "Bo", "text": "my violin exam is on Friday"}]}]},
            {"id": "cy", "sessions": [{"id": "s1", "date": "2024-06-01", "turns": [
                {"id": "c1", "speaker": "Cy", "text": "the bakery sells rye bread"},
                {"id": "c2", "speaker": "Di", "text": "and violin shaped cookies"}]}]},
            {"id": "ed", "sessions": [{"id": "s1", "date": "2024-07-01", "turns": [
                {"id": "e1", "speaker": "Ed", "text": "we repainted the fence green"}]}]},
        ],
        "questions": [
            {"conversation": "ann", "question": "When is the violin exam?", "evidence": ["a2"]},
            {"conversation": "cy", "question": "What bread does the bakery sell?",
             "evidence": ["c1"]},
            {"conversation": "ed", "question": "What colour is the fence?", "evidence": ["e1"]},
        ],
    }


def test_pairs_each_conversation_with_the_next() -> None:
    assert negative_pairs(dataset_from_json(tiny())) == {"ann": "cy", "cy": "ed", "ed": "ann"}


async def test_negatives_count_what_recall_puts_in_another_index() -> None:
    result = await run_benchmark(dataset_from_json(tiny()), dataset_name="tiny", prompt=True,
                                 negatives=True)
    block = result.report["negatives"]
    assert block["questions"] == 3
    rows = [q["negative"] for q in result.per_question]
    assert [r["askedIn"] for r in rows] == ["cy", "ed", "ann"]
    # "violin" is in cy's index: ann's question finds it there; the others share no word.
    assert rows[0]["any-recalled"] == 1.0 and rows[0]["tokens"] > 0
    assert block["overall"]["any-recalled"] == pytest.approx(
        sum(r["any-recalled"] for r in rows) / 3)
    assert block["overall"]["tokens"] == pytest.approx(sum(r["tokens"] for r in rows) / 3)
    assert "prompt" in result.report  # the positives are still reported as before
    assert "negatives:" in recall.format_table(result)


async def test_without_the_flag_nothing_changes() -> None:
    result = await run_benchmark(dataset_from_json(tiny()), dataset_name="tiny", prompt=True)
    assert "negatives" not in result.report
    assert all("negative" not in q for q in result.per_question)
    assert "negatives:" not in recall.format_table(result)


def test_cli_writes_negatives_json(tmp_path: Path) -> None:
    data = tmp_path / "tiny.json"
    data.write_text(json.dumps(tiny()), encoding="utf-8")
    out = tmp_path / "out.json"
    assert recall.main([str(data), "--negatives", "--json", str(out)], stdout=io.StringIO(),
                       stderr=io.StringIO()) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert set(report["negatives"]["overall"]) == {"any-recalled", "excerpts", "tokens"}
    one = tmp_path / "one.json"
    one.write_text(json.dumps({"conversations": tiny()["conversations"][:1],
                               "questions": tiny()["questions"][:1]}), encoding="utf-8")
    err = io.StringIO()
    assert recall.main([str(one), "--negatives"], stdout=io.StringIO(), stderr=err) == 2
    assert "two conversations" in err.getvalue()
