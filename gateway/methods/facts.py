"""``memory.facts.list / add / update / delete``: the user's own control over remembered facts.

Every call is scoped to the caller: another user's fact id answers -32002 exactly like an
unknown one. Text length is bounded by the same ``memory.facts_max_chars`` the store
enforces; page size by :data:`MAX_PAGE`, a fixed wire bound (not a config key).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict

from gateway.rpc import Bound, CallContext, Registry, bounded
from gateway.wire import FactChangeWire, FactWire, fact_change_wire, fact_wire
from memory import Memory, MemoryConfig

__all__ = ["MAX_PAGE", "FactsMethods", "declare_facts"]

MAX_PAGE = 200


@dataclass(frozen=True, slots=True)
class ListFactsParams:
    limit: int = bounded(50, min=1, max=MAX_PAGE)
    before: int | None = bounded(None, min=1, doc="cursor: the next of the previous page")
    include_inactive: bool = False


@dataclass(frozen=True, slots=True)
class AddFactParams:
    text: str = bounded()


@dataclass(frozen=True, slots=True)
class UpdateFactParams:
    id: int = bounded(min=1)
    text: str = bounded()


@dataclass(frozen=True, slots=True)
class FactIdParams:
    id: int = bounded(min=1)


class FactsPageReply(TypedDict):
    facts: list[FactWire]
    next: NotRequired[int]  # the cursor for the next page, when there is one


class FactDeleted(TypedDict):
    deleted: Literal[True]
    id: int


class FactsMethods:
    def __init__(self, service: Memory) -> None:
        self.service = service

    async def list(self, ctx: CallContext, p: ListFactsParams) -> FactsPageReply:
        page = await self.service.facts.page(ctx.caller, limit=p.limit, before=p.before,
                                             include_inactive=p.include_inactive)
        out: FactsPageReply = {"facts": [fact_wire(f) for f in page.facts]}
        if page.next is not None:
            out["next"] = page.next
        return out

    async def add(self, ctx: CallContext, p: AddFactParams) -> FactChangeWire:
        # The client token's name goes with the fact, so the Facts panel says who added it.
        return fact_change_wire(await self.service.facts.add(ctx.caller, p.text, source="user",
                                                             client=ctx.client))

    async def update(self, ctx: CallContext, p: UpdateFactParams) -> FactChangeWire:
        return fact_change_wire(await self.service.facts.update(ctx.caller, p.id, p.text,
                                                                client=ctx.client))

    async def delete(self, ctx: CallContext, p: FactIdParams) -> FactDeleted:
        change = await self.service.facts.delete(ctx.caller, p.id)
        return {"deleted": True, "id": change.fact.id}


def declare_facts(reg: Registry, config: MemoryConfig, h: FactsMethods | None) -> None:
    text = {"text": Bound(max_len=config.facts_max_chars)}
    reg.declare("memory.facts.list", ListFactsParams,
                "Your remembered facts, newest first (paginated).",
                h.list if h else None, result=FactsPageReply)
    reg.declare("memory.facts.add", AddFactParams,
                "Remember a fact (de-duplicated against your facts).",
                h.add if h else None, result=FactChangeWire, bounds=text)
    reg.declare("memory.facts.update", UpdateFactParams,
                "Correct a fact; the old version is kept inactive.",
                h.update if h else None, result=FactChangeWire, bounds=text)
    reg.declare("memory.facts.delete", FactIdParams,
                "Forget a fact and every earlier version of it.",
                h.delete if h else None, result=FactDeleted)
