"""Bringing an existing chat history in: what ``recalld import FILE`` and ``sessions.import`` share.

Parsing is pure (bytes in, :class:`Conversation` values out) and checks the whole file before
anything is written, so a malformed file is refused with the place it went wrong and nothing
is half-imported. Formats:

* **chatgpt** — ``conversations.json`` from ChatGPT's "Export data": a JSON array of
  conversations, each a tree of nodes (``mapping``) whose displayed thread runs from
  ``current_node`` up through ``parent`` links. That thread is imported (edited-away branches
  are not); ``user`` and ``assistant`` messages with text are kept, system/tool messages and
  non-text parts (images, files) are dropped.
* **jsonl** — recalld transcripts, one or more concatenated: a ``"type":"session"`` header line
  starts a session, ``"type":"message"`` lines follow (docs/sessions.md). Keys, ids are
  re-made; roles, text, times and names are kept, and the extra keys of every line but a
  user's (``chat.send`` writes none there, so an imported one keeps none either).

Titles are cleaned as a title made from a message is (:func:`sessions.plain_title`): the control
characters ``sessions.create`` refuses (NUL, a terminal's escape sequences) become spaces.

:func:`write_conversations` writes parsed conversations into a session store, the CLI's own
(``gateway.cli.importer``) or the running daemon's (``gateway.methods.importing``):

* **Idempotent**: each conversation's session key is derived from the user, the format and the
  conversation's id in the file (:func:`session_key_for`), so a second import finds its
  session and adds nothing.
* **Resumable**: a session holding the first N messages of its conversation (an import cut
  short) gets the rest appended; every message is one whole-line write.
* **Skips what the store refuses, and goes on**: a title, model or system prompt the store
  refuses (too long) is left out of its session, and so is a model the daemon does not offer
  (``llm.model`` and ``llm.models``, as ``sessions.create`` checks); a message whose line would
  pass ``sessions.max_line_bytes`` is written as a one-line placeholder saying so, so the
  transcript still holds one line per message and a resumed import lines up the same way.
  Each is reported.

A leaf: the CLI and the gateway's methods both import it, and it imports only ``sessions``.
"""


from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from sessions import (
    DEFAULT_TITLE,
    MESSAGE_ROLES,
    SUMMARY_TYPE,
    Header,
    InvalidSessionInput,
    LineTooLarge,
    Message,
    SessionNotFound,
    SessionStoreLike,
    check_user,
    plain_title,
)

__all__ = ["Conversation", "Format", "ImportFormatError", "ImportReport", "Progress", "Turn",
           "detect", "parse", "session_key_for", "write_conversations"]

Format = Literal["chatgpt", "jsonl"]
_CHATGPT_ROLES = frozenset({"user", "assistant"})


class ImportFormatError(ValueError):
    """The file is not in the named (or any known) format; the message says where."""


@dataclass(frozen=True, slots=True)
class Turn:
    role: str
    content: str
    ts: str | None               # ISO-8601; None: the conversation's start
    name: str | None = None
    run_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class Conversation:
    source_id: str               # stable within the file: what makes a re-import idempotent
    title: str
    created_at: str | None
    turns: tuple[Turn, ...]
    system_prompt: str | None = None
    model: str | None = None


def detect(data: bytes) -> Format:
    """``chatgpt`` for a JSON array, ``jsonl`` for lines of objects."""
    head = data.lstrip()[:1]
    if head == b"[":
        return "chatgpt"
    if head == b"{":
        return "jsonl"
    if data.startswith(b"PK\x03\x04"):
        raise ImportFormatError(
            "a zip archive (ChatGPT's whole export): unzip it and import its conversations.json")
    raise ImportFormatError("not a ChatGPT conversations.json (a JSON array) nor recalld JSONL")


def parse(data: bytes, fmt: Format | None = None) -> list[Conversation]:
    fmt = fmt or detect(data)
    return list(_chatgpt(data) if fmt == "chatgpt" else _jsonl(data))


def _epoch(value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return datetime.fromtimestamp(float(value), UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        return None


def _text(content: object) -> str:
    """The text of a ChatGPT message's ``content`` (string parts only)."""
    if not isinstance(content, dict):
        return ""
    kind = content.get("content_type")
    if kind in ("text", "multimodal_text"):
        parts = content.get("parts")
        if isinstance(parts, list):
            return "\n".join(p for p in parts if isinstance(p, str)).strip()
    if kind == "code" and isinstance(content.get("text"), str):
        return str(content["text"]).strip()
    return ""


def _thread(mapping: dict[str, Any], current: object) -> list[dict[str, Any]]:
    """The nodes from the root to ``current`` (the branch the user last saw)."""
    if not isinstance(current, str) or current not in mapping:
        # No current node: follow first children from the root(s).
        roots = [n for n in mapping.values() if isinstance(n, dict) and not n.get("parent")]
        path: list[dict[str, Any]] = []
        node = roots[0] if roots else None
        while isinstance(node, dict) and len(path) <= len(mapping):
            path.append(node)
            children = node.get("children") or []
            node = mapping.get(children[0]) if children and isinstance(children[0], str) else None
        return path
    path = []
    seen: set[str] = set()
    node_id: object = current
    while isinstance(node_id, str) and node_id in mapping and node_id not in seen:
        seen.add(node_id)
        node = mapping[node_id]
        if not isinstance(node, dict):
            break
        path.append(node)
        node_id = node.get("parent")
    return path[::-1]


def _chatgpt(data: bytes) -> Iterator[Conversation]:
    try:
        items = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ImportFormatError(f"not valid JSON: {exc}") from None
    if not isinstance(items, list):
        raise ImportFormatError("a ChatGPT export is a JSON array of conversations")
    for n, conv in enumerate(items):
        where = f"conversation {n + 1}"
        if not isinstance(conv, dict) or not isinstance(conv.get("mapping"), dict):
            raise ImportFormatError(f"{where}: no 'mapping' object (not a ChatGPT conversation)")
        source = conv.get("conversation_id") or conv.get("id")
        if not isinstance(source, str) or not source:
            raise ImportFormatError(f"{where}: no 'conversation_id' or 'id'")
        turns: list[Turn] = []
        for node in _thread(conv["mapping"], conv.get("current_node")):
            msg = node.get("message")
            if not isinstance(msg, dict):
                continue
            author = msg.get("author")
            role = author.get("role") if isinstance(author, dict) else None
            raw_meta = msg.get("metadata")
            meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
            if role not in _CHATGPT_ROLES or meta.get("is_visually_hidden_from_conversation"):
                continue
            text = _text(msg.get("content"))
            if text:
                model = meta.get("model_slug")
                turns.append(Turn(str(role), text, _epoch(msg.get("create_time")),
                                  extra=({"model": model}
                                         if isinstance(model, str) and role == "assistant"
                                         else {})))
        title = conv.get("title")
        yield Conversation(source,
                           ((plain_title(title) if isinstance(title, str) else None)
                            or "Imported conversation"),
                           _epoch(conv.get("create_time")), tuple(turns))


def _jsonl(data: bytes) -> Iterator[Conversation]:
    header: Header | None = None
    turns: list[Turn] = []
    for number, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ImportFormatError(f"line {number}: not valid JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise ImportFormatError(f"line {number}: not a JSON object")
        if obj.get("type") == "session":
            if header is not None:
                yield _from_header(header, turns)
            header, turns = Header.from_line(obj), []
            if header is None:
                raise ImportFormatError(f"line {number}: a malformed session header")
            continue
        if obj.get("type") == SUMMARY_TYPE:
            continue  # a conversation summary is derived; the daemon writes a new one
        message = Message.from_line(obj)
        if message is None or message.role not in MESSAGE_ROLES:
            raise ImportFormatError(f"line {number}: not a well-formed message line")
        if header is None:
            raise ImportFormatError(f"line {number}: a message before any session header")
        turns.append(Turn(message.role, message.content, message.ts, message.name, message.run_id,
                          {} if message.role == "user" else message.extra))
    if header is None:
        raise ImportFormatError("no session header line ('\"type\":\"session\"') in the file")
    yield _from_header(header, turns)


def _from_header(header: Header, turns: list[Turn]) -> Conversation:
    return Conversation(header.session_key, plain_title(header.title) or DEFAULT_TITLE,
                        header.created_at, tuple(turns), header.system_prompt, header.model)


# ----------------------------------------------------------------- writing into a store


@dataclass(frozen=True, slots=True)
class ImportReport:
    conversations: int
    created: int         # new sessions
    resumed: int         # sessions that held a prefix and got the rest
    unchanged: int       # already complete: nothing written
    empty: int           # conversations with no text messages: skipped
    messages: int        # message lines written (for a dry run: that would be written)
    seconds: float
    skipped: tuple[str, ...] = ()  # what was left out, one line each
    created_keys: tuple[str, ...] = ()  # the sessions made, in the file's order
    resumed_keys: tuple[str, ...] = ()  # the sessions that got the rest of their messages


def session_key_for(user: str, fmt: str, source_id: str) -> str:
    """The session key an imported conversation gets: stable across runs, 32 hex digits."""
    return hashlib.sha256(f"recalld-import\0{user}\0{fmt}\0{source_id}".encode()).hexdigest()[:32]


Progress = Callable[[int, int, int, int], None]  # conversations done/total, messages done/total


# The store's name of a header field it refuses -> the keyword of create.
_HEADER_FIELDS = {"title": "title", "model": "model", "systemPrompt": "system_prompt"}


def write_conversations(store: SessionStoreLike, user: str, fmt: str,
                        conversations: Sequence[Conversation], progress: Progress | None = None, *,
                        models: tuple[str, ...] | None = None,
                        dry_run: bool = False) -> ImportReport:
    """Write ``conversations`` as ``user``'s sessions into ``store``; blocking. ``models``: the
    models a session may keep (LlmConfig.choices); None: any. ``dry_run``: count what would be
    written and write nothing (a field the store would refuse shows only when written).

    A :class:`~sessions.SessionError` stops it where it is: what was written stays, and the
    same import resumes (module docstring)."""
    user = check_user(user)
    started = time.perf_counter()
    total_messages = sum(len(c.turns) for c in conversations)
    created = resumed = unchanged = empty = written = seen = 0
    skipped: list[str] = []
    created_keys: list[str] = []
    resumed_keys: list[str] = []
    for done, conv in enumerate(conversations, 1):
        seen += len(conv.turns)
        if not conv.turns:
            empty += 1
            continue
        key = session_key_for(user, fmt, conv.source_id)
        try:
            have = store.get(user, key).message_count
        except SessionNotFound:
            header = {"title": conv.title, "system_prompt": conv.system_prompt, "model": conv.model}
            if conv.model is not None and models is not None and conv.model not in models:
                # Every run goes out on the operator's key: only an offered model is kept.
                header["model"] = None
                skipped.append(f"conversation {conv.source_id!r}: model left out: {conv.model!r} "
                               "is not offered here (llm.model, llm.models)")
            while not dry_run:
                try:
                    store.create(user, title=header["title"], system_prompt=header["system_prompt"],
                                 model=header["model"],
                                 created_at=conv.created_at or conv.turns[0].ts, session_key=key)
                    break
                except InvalidSessionInput as exc:
                    # The field at fault goes; a header line too large loses its prompt.
                    name = _HEADER_FIELDS.get(exc.field, "system_prompt")
                    if header[name] is None:
                        raise
                    header[name] = None
                    skipped.append(f"conversation {conv.source_id!r}: {name.replace('_', ' ')} "
                                   f"left out: {exc.reason}")
            have = -1
        rest = conv.turns[max(have, 0):]
        if have == -1:
            created += 1
            created_keys.append(key)
        elif rest:
            resumed += 1
            resumed_keys.append(key)
        else:
            unchanged += 1
        if dry_run:
            written += len(rest)
            rest = ()
        for i, turn in enumerate(rest, max(have, 0)):
            ts = turn.ts or conv.created_at
            try:
                store.append_message(user, key, role=turn.role, content=turn.content,
                                     run_id=turn.run_id, name=turn.name, ts=ts,
                                     extra=turn.extra or None)
            except LineTooLarge as exc:
                skipped.append(
                    f"conversation {conv.source_id!r}: message {i + 1} not imported: {exc.reason}")
                store.append_message(user, key, role=turn.role, ts=ts, content=(
                    f"[not imported: this message's line would be {exc.size} bytes, more than "
                    f"sessions.max_line_bytes ({exc.limit})]"))
            written += 1
        if progress is not None:
            progress(done, len(conversations), seen, total_messages)
    if not dry_run:
        store.flush()
    return ImportReport(len(conversations), created, resumed, unchanged, empty, written,
                        time.perf_counter() - started, tuple(skipped), tuple(created_keys),
                        tuple(resumed_keys))
