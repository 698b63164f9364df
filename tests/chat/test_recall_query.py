"""The recall query of a chat message (gateway.chat.prompt.recall_query): a short follow-up is
searched with the exchange before it; anything longer is searched as it is."""

from __future__ import annotations

from gateway.chat.prompt import FOLLOW_UP_CONTEXT_CHARS, recall_query
from sessions import Message


def m(role: str, content: str) -> Message:
    return Message(f"id-{role}-{len(content)}", role, content, "2026-11-01T10:00:00.000Z", None)


def test_a_short_follow_up_gets_the_previous_question_and_the_reply_s_first_sentence() -> None:
    history = [m("user", "Which two books did Ana recommend?"),
               m("assistant", "She recommended Dune and Solaris. Both are science fiction.")]
    assert recall_query("and the second one?", history) == (
        "Which two books did Ana recommend? She recommended Dune and Solaris. and the second one?")


def test_a_message_with_enough_words_of_its_own_is_searched_alone() -> None:
    history = [m("user", "Which two books did Ana recommend?"), m("assistant", "Dune and Solaris.")]
    message = "What did the doctor say about my knee last spring?"
    assert recall_query(message, history) == message


def test_no_earlier_user_message_leaves_the_follow_up_alone_and_parts_are_bounded() -> None:
    assert recall_query("and her?", []) == "and her?"
    long = "word " * 500
    out = recall_query("why?", [m("user", long), m("assistant", long)])
    assert len(out) <= 2 * FOLLOW_UP_CONTEXT_CHARS + len(" why?") + 1
