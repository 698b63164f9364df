"""``memory.episodes.list``: the caller's episodes (dated summaries of earlier conversations)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NotRequired, TypedDict

from gateway.methods.facts import MAX_PAGE
from gateway.rpc import CallContext, Registry, bounded
from gateway.wire import EpisodeWire, episode_wire
from memory import Memory

__all__ = ["EpisodesMethods", "declare_episodes"]


@dataclass(frozen=True, slots=True)
class ListEpisodesParams:
    limit: int = bounded(20, min=1, max=MAX_PAGE)
    before: int | None = bounded(None, min=1, doc="cursor: the next of the previous page")


class EpisodeQueue(TypedDict):
    """Summaries still to write."""

    pending: int
    failed: int  # failed at least once, waiting for their next try


class EpisodesPageReply(TypedDict):
    episodes: list[EpisodeWire]
    queue: EpisodeQueue
    next: NotRequired[int]  # the cursor for the next page, when there is one


class EpisodesMethods:
    def __init__(self, service: Memory) -> None:
        self.service = service

    async def list(self, ctx: CallContext, p: ListEpisodesParams) -> EpisodesPageReply:
        episodes, nxt = await self.service.episodes.page(ctx.caller, limit=p.limit, before=p.before)
        state = await self.service.episodes.queue_state()
        out: EpisodesPageReply = {"episodes": [episode_wire(e) for e in episodes],
                                  "queue": {"pending": state["pending"], "failed": state["failed"]}}
        if nxt is not None:
            out["next"] = nxt
        return out


def declare_episodes(reg: Registry, h: EpisodesMethods | None) -> None:
    reg.declare("memory.episodes.list", ListEpisodesParams, "Your episodes: dated summaries of "
                "earlier conversations, newest first (paginated).", h.list if h else None,
                result=EpisodesPageReply)
