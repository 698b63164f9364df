"""The gateway's part in episodes: its chat model as memory's :class:`~memory.Summarizer`.

The episode writer itself (rules, jobs, merging) is memory's (``memory/episodes/writer.py``).
"""

from __future__ import annotations

from gateway.chat.llm import ChatModel
from gateway.errors import GatewayError
from memory import SummarizerError

__all__ = ["ModelSummarizer"]


class ModelSummarizer:
    """One reply of the chat model, not streamed, asked with ``model_name``."""

    def __init__(self, model: ChatModel, model_name: str) -> None:
        self.model = model
        self.model_name = model_name

    async def summarise(self, messages: list[dict[str, str]]) -> str:
        try:
            return await self.model.complete(messages, model=self.model_name)
        except GatewayError as exc:
            # Named in the job's error as before the writer moved: the upstream error's class.
            raise SummarizerError(f"{type(exc).__name__}: {exc}") from exc
