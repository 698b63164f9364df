"""The model's memory tools: ``remember``, ``forget``, ``search_memory``, run mid-stream.

With ``memory.facts = "tool"`` a run's request offers the three tools (the prompt, built by
``gateway/chat/prompt.py``, says how to use them and lists the user's facts most related to the
message, with their ids so a correction can name what it ``replaces``). The tools are declared
like RPC methods: a params dataclass each, the JSON schema and the validation of a call's
arguments from ``gateway.rpc``'s registry, and one dispatch (:class:`ToolBox`). When
the model answers with tool calls, :meth:`MemoryToolRun.stream` executes them, appends the
assistant's calls and the tool results to the messages and asks again, at most
``chat.max_tool_rounds`` times; the last round offers no tools, so a reply always ends in text.
Text streamed in any round is part of the reply.

Everything the tools return to the model is data: a failed call becomes an error result the
model can read (never a failed run), and ``search_memory`` results are quoted exactly like the
automatic recall block. ``chat.final`` then lists the facts saved or changed and what
``search_memory`` found (:meth:`MemoryToolRun.final_fields`).

With ``memory.facts = "block"`` — or ``"tool"`` with a model that has refused tools — the
request offers no tools; the prompt instead asks for a trailing ``<memory_update>`` JSON block
(``memory/facts/block.py``), which is held back from the stream, stripped from the reply
and applied through the same ``remember``/``forget`` code as the tools' calls.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import structlog

from gateway.chat.llm import ChatEvent, ChatModel, Completion, Messages, TextDelta, ToolCall
from gateway.chat.prompt import format_recall_block
from gateway.errors import InvalidParams
from gateway.rpc import Bound, Registry, bounded, parse_params
from gateway.wire import fact_change_wire
from memory import (
    BlockFilter,
    FactChange,
    MalformedBlock,
    Memory,
    MemoryContext,
    MemoryIndexError,
    RunMemory,
    ShownHistory,
    drop_shown,
    parse_block,
)

__all__ = ["ForgetParams", "MemoryToolRun", "MemoryTools", "RememberParams", "SearchMemoryParams",
           "ToolBox", "memory_toolbox"]

log = structlog.get_logger("recalld.chat.tools")

ToolResult = dict[str, Any] | str


@dataclass(frozen=True, slots=True)
class RememberParams:
    text: str = bounded(doc="One self-contained sentence in the user's language.")
    replaces: int | None = bounded(None, doc="Id of a remembered fact this one corrects.")


@dataclass(frozen=True, slots=True)
class ForgetParams:
    id: int


@dataclass(frozen=True, slots=True)
class SearchMemoryParams:
    query: str
    after: str | None = bounded(None, doc="ISO-8601 date: only what was said after it.")
    before: str | None = bounded(None, doc="ISO-8601 date: only what was said before it.")


ToolHandler = Callable[["MemoryToolRun", Any], Awaitable[ToolResult]]


class ToolBox:
    """The model's tools: each declared once with its params dataclass, summary and handler; the
    function specs offered to the model and the check of a call's arguments both come from the
    RPC registry's reading of the dataclass, so they cannot disagree."""

    def __init__(self) -> None:
        self._registry = Registry()
        self._handlers: dict[str, ToolHandler] = {}
        self._specs: list[dict[str, Any]] | None = None

    def declare(self, name: str, params: type[Any], summary: str, handler: ToolHandler, *,
                bounds: Mapping[str, Bound] | None = None) -> None:
        self._registry.declare(name, params, summary, bounds=bounds, requires_auth=False)
        self._handlers[name] = handler
        self._specs = None

    def specs(self) -> list[dict[str, Any]]:
        """The OpenAI function tools, in the order declared."""
        if self._specs is None:
            methods = {m["name"]: m for m in self._registry.openrpc("tools")["methods"]}
            self._specs = [_function_spec(methods[name]) for name in self._handlers]
        return self._specs

    async def call(self, run: MemoryToolRun, name: str, args: Any) -> ToolResult:
        """Run tool ``name`` with wire ``args``; raises InvalidParams for arguments that do not
        fit."""
        method = self._registry.find(name)
        if method is None:
            return {"ok": False, "error": f"unknown tool {name!r}"}
        return await self._handlers[name](run, parse_params(method, args))


def _function_spec(method: Mapping[str, Any]) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    for param in method["params"]:
        schema = param["schema"]
        if not param["required"] and "oneOf" in schema:
            # An optional argument is one the model leaves out; null is accepted, not offered.
            schema = next(s for s in schema["oneOf"] if s != {"type": "null"})
        if "description" in param:
            schema = {**schema, "description": param["description"]}
        properties[param["name"]] = schema
    return {"type": "function", "function": {
        "name": method["name"], "description": method["summary"], "parameters": {
            "type": "object", "properties": properties,
            "required": [p["name"] for p in method["params"] if p["required"]],
            "additionalProperties": False}}}


async def _remember(run: MemoryToolRun, p: RememberParams) -> ToolResult:
    change = await run.memory.facts.add(run.user, p.text, source="model", replaces=p.replaces,
                                        session_key=run.session_key, run_id=run.run_id)
    run.changes.append(change)
    return {"ok": True, "action": change.action, "id": change.fact.id}


async def _forget(run: MemoryToolRun, p: ForgetParams) -> ToolResult:
    change = await run.memory.facts.delete(run.user, p.id)
    run.changes.append(change)
    return {"ok": True, "action": "deleted", "id": change.fact.id}


async def _search_memory(run: MemoryToolRun, p: SearchMemoryParams) -> ToolResult:
    # The whole history of this session but what the prompt shows, as automatic recall does.
    response = await run.memory.search(run.user, p.query, k=run.recall_k, after=p.after,
                                       before=p.before, shown=run.shown)
    hits = drop_shown(response.results, run.shown)
    run.searched.append({"query": p.query, "chunkIds": [str(h.chunk_id) for h in hits]})
    return format_recall_block(hits, run.session_key) if hits else "No matching excerpts."


def memory_toolbox(max_chars: int) -> ToolBox:
    """remember, forget and search_memory, with the fact length ``memory.facts_max_chars``."""
    box = ToolBox()
    box.declare("remember", RememberParams,
                "Save one durable fact the user stated or confirmed about themselves.",
                _remember, bounds={"text": Bound(max_len=max_chars)})
    box.declare("forget", ForgetParams,
                "Forget a remembered fact, by its id, when the user asks you to.", _forget)
    box.declare("search_memory", SearchMemoryParams,
                "Search the user's earlier conversations when the recalled excerpts are not "
                "enough.", _search_memory)
    return box


class MemoryTools:
    """Per-gateway settings; :meth:`begin` makes the state of one run."""

    def __init__(self, memory: Memory, recall_k: int, max_rounds: int) -> None:
        self.memory = memory
        self.recall_k = recall_k
        self.max_rounds = max_rounds
        self.toolbox = (memory_toolbox(memory.config.facts_max_chars) if memory.config.enabled
                        else None)

    def begin(self, user: str, session_key: str, run_id: str, run: RunMemory,
              context: MemoryContext, shown: ShownHistory | None = None) -> MemoryToolRun:
        return MemoryToolRun(self, user, session_key, run_id, run, context, shown=shown)


@dataclass(eq=False)
class MemoryToolRun:
    tools: MemoryTools
    user: str
    session_key: str
    run_id: str
    run: RunMemory
    context: MemoryContext  # what the prompt was given; its episodes are listed in chat.final
    shown: ShownHistory | None = None  # the prompt's history window: search_memory leaves it out
    changes: list[FactChange] = field(default_factory=list)
    searched: list[dict[str, Any]] = field(default_factory=list)

    @property
    def memory(self) -> Memory:
        return self.tools.memory

    @property
    def recall_k(self) -> int:
        return self.tools.recall_k

    def final_fields(self) -> dict[str, Any]:
        """What ``chat.final`` adds: facts saved or changed, search_memory's finds, episodes
        shown."""
        out: dict[str, Any] = {}
        if self.changes:
            out["facts"] = [fact_change_wire(c) for c in self.changes]
        if self.searched:
            out["searched"] = self.searched
        if self.context.episodes:
            out["episodes"] = [s.episode.id for s in self.context.episodes]
        return out

    async def stream(self, model: ChatModel, messages: Messages,
                     model_name: str) -> AsyncGenerator[ChatEvent, None]:
        """The reply's events across tool rounds: text as it comes, one Completion at the end."""
        toolbox = self.tools.toolbox
        if self.run.facts == "block":
            async with contextlib.aclosing(self._stream_block(model, messages,
                                                              model_name)) as events:
                async for event in events:
                    yield event
            return
        if self.run.facts == "off" or toolbox is None:
            async with contextlib.aclosing(model.stream(messages, model=model_name)) as events:
                async for event in events:
                    yield event
            return
        convo: list[Mapping[str, Any]] = list(messages)
        specs = toolbox.specs()
        usage: dict[str, int] = {}
        rounds = self.tools.max_rounds
        for round_no in range(rounds + 1):
            offer = specs if round_no < rounds and model.supports_tools else None
            calls: list[ToolCall] = []
            text: list[str] = []
            completion: Completion | None = None
            async with contextlib.aclosing(model.stream(convo, model=model_name,
                                                        tools=offer)) as events:
                async for event in events:
                    if isinstance(event, TextDelta):
                        text.append(event.text)
                        yield event
                    elif isinstance(event, ToolCall):
                        calls.append(event)
                    else:
                        completion = event
            assert completion is not None  # stream() ends with one, or raises
            for key, value in (completion.usage or {}).items():
                usage[key] = usage.get(key, 0) + value
            if not calls or offer is None:
                yield Completion(completion.finish_reason, usage or None, completion.model)
                return
            convo.append({"role": "assistant", "content": "".join(text) or None, "tool_calls": [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in calls]})
            for call in calls:
                result = await self._execute(call)
                convo.append({"role": "tool", "tool_call_id": call.id, "content": result})

    async def _stream_block(self, model: ChatModel, convo: Messages,
                            model_name: str) -> AsyncGenerator[ChatEvent, None]:
        """One request, no tools: text sent on as the block filter releases it; at the end the
        trailing block, if any, is applied before the Completion (so chat.final lists it)."""
        held = BlockFilter(self.memory.config.facts_block_max_chars)
        async with contextlib.aclosing(model.stream(convo, model=model_name)) as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    out = held.feed(event.text)
                    if out:
                        yield TextDelta(out)
                elif isinstance(event, Completion):
                    end = held.finish()
                    if end.tail:
                        yield TextDelta(end.tail)
                    if end.found:
                        await self._apply_block(end.body)
                    yield event

    async def _apply_block(self, body: str | None) -> None:
        try:
            block = parse_block(body)
        except MalformedBlock as exc:
            # Stripped all the same: a broken block is the model's slip, never the user's text.
            log.warning("chat.fact_block_malformed", error=str(exc))
            return
        calls: list[tuple[str, dict[str, Any]]] = [
            ("remember",
             {"text": r.text} if r.replaces is None else {"text": r.text, "replaces": r.replaces})
            for r in block.remember]
        calls += [("forget", {"id": fact_id}) for fact_id in block.forget]
        for name, args in calls:
            result = await self._run_tool(name, args)
            if isinstance(result, dict) and not result.get("ok", True):
                log.warning("chat.fact_block_entry_refused", tool=name, error=result.get("error"))

    async def _execute(self, call: ToolCall) -> str:
        try:
            args = orjson.loads(call.arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            result: ToolResult = {"ok": False, "error": f"bad arguments for {call.name}: {exc}"}
            log.info("chat.tool", tool=call.name, ok=False)
        else:
            result = await self._run_tool(call.name, args)
        return orjson.dumps(result).decode() if isinstance(result, dict) else str(result)

    async def _run_tool(self, name: str, args: dict[str, Any]) -> ToolResult:
        """One tool call (or block entry), its failures turned into an error result."""
        toolbox = self.tools.toolbox
        assert toolbox is not None  # only runs with facts on call tools
        try:
            result = await toolbox.call(self, name, args)
        except (InvalidParams, ValueError, TypeError, KeyError) as exc:
            result = {"ok": False, "error": f"bad arguments for {name}: {exc}"}
        except MemoryIndexError as exc:
            result = {"ok": False, "error": str(exc)}
        log.info("chat.tool", tool=name,
                 ok=result.get("ok", True) if isinstance(result, dict) else True,
                 block=self.run.facts == "block")
        return result
