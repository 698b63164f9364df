"""Chat runs and what they need: the model client, the prompt builder, and the hub that
delivers a session's events to the connections attached to it.

Imports :mod:`gateway.rpc` (the caller a hub delivers to) and the ``sessions``/``memory``
packages; never the transport or the method handlers.
"""

from __future__ import annotations

from gateway.chat.hub import ALL_SESSIONS, Hub
from gateway.chat.llm import (
    ChatEvent,
    ChatModel,
    Completion,
    OpenAIChatModel,
    TextDelta,
    create_chat_model,
)
from gateway.chat.prompt import Prompt, build_prompt, format_recall_block
from gateway.chat.runs import ChatRuns, Run
from gateway.chat.titles import TITLE_INSTRUCTION, announce, update_session

__all__ = [
    "ALL_SESSIONS",
    "TITLE_INSTRUCTION",
    "ChatEvent",
    "ChatModel",
    "ChatRuns",
    "Completion",
    "Hub",
    "OpenAIChatModel",
    "Prompt",
    "Run",
    "TextDelta",
    "build_prompt",
    "create_chat_model",
    "announce",
    "format_recall_block",
    "update_session",
]
