"""``chat.send``'s ``attachments``: checked, sniffed and turned into what the model is given.

Nothing here trusts the caller's word: a file declared ``text/*`` must decode as UTF-8, an image
must start with its format's magic bytes, a PDF must open (not encrypted) with ``pypdf``, and an
archive is refused whatever it is declared as. Each refusal is an :class:`InvalidParams` naming
``attachments[i].<field>``, raised before anything is counted, stored or appended.

A PDF is read in a worker thread against a deadline (``chat.attachment_timeout_s``), page by
page up to ``chat.attachment_pdf_pages``, and stops once ``chat.attachment_text_chars`` are
extracted, so a crafted file (thousands of pages, a compression bomb) costs a bounded time;
pypdf bounds each stream's decompressed size itself.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.config import ChatConfig
from gateway.errors import InvalidParams

__all__ = ["IMAGE_TYPES", "Upload", "line_meta", "parse_attachments", "pdf_text", "text_block"]

Kind = Literal["text", "pdf", "image"]

# Each image type's magic bytes at the start of the file.
IMAGE_TYPES: dict[str, tuple[bytes, ...]] = {
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),  # and "WEBP" at offset 8, checked below
}
# Source and data files browsers declare as application/*; they are text like text/*.
_TEXT_APPLICATION = frozenset({
    "application/json", "application/javascript", "application/x-javascript",
    "application/typescript", "application/xml", "application/x-sh", "application/x-python",
    "application/x-python-code", "application/toml", "application/x-toml", "application/yaml",
    "application/x-yaml", "application/sql", "application/x-httpd-php", "application/ld+json",
})
# Archives (and compressed files) by their magic bytes: refused whatever they are declared as.
_ARCHIVES: tuple[tuple[int, bytes, str], ...] = (
    (0, b"PK\x03\x04", "zip"), (0, b"PK\x05\x06", "zip"), (0, b"PK\x07\x08", "zip"),
    (0, b"\x1f\x8b", "gzip"), (0, b"BZh", "bzip2"), (0, b"\xfd7zXZ\x00", "xz"),
    (0, b"7z\xbc\xaf\x27\x1c", "7z"), (0, b"Rar!\x1a\x07", "rar"), (0, b"\x28\xb5\x2f\xfd", "zstd"),
    (257, b"ustar", "tar"),
)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_MAX_NAME_CHARS = 255
_KEYS = frozenset({"name", "mediaType", "data"})


@dataclass(frozen=True, slots=True)
class Upload:
    """One checked attachment: its bytes, what it is and (text files, PDFs) its text."""

    name: str
    media_type: str
    data: bytes
    kind: Kind
    text: str | None = None  # set for text files here; for PDFs once extracted (pdf_text)


def _field(i: int, key: str) -> str:
    return f"attachments[{i}].{key}"


def parse_attachments(value: Any, config: ChatConfig) -> list[Upload]:
    """The checked attachments of a ``chat.send`` (empty for none); PDFs' text comes later
    (:func:`pdf_text`, in a worker thread)."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidParams("attachments", "must be an array of {name, mediaType, data}")
    if len(value) > config.max_attachments:
        raise InvalidParams("attachments", f"has {len(value)} files; at most "
                            f"{config.max_attachments} may be sent with one message "
                            "(chat.max_attachments)")
    return [_one(i, item, config) for i, item in enumerate(value)]


def _one(i: int, item: Any, config: ChatConfig) -> Upload:
    if not isinstance(item, dict):
        raise InvalidParams(f"attachments[{i}]", "must be an object {name, mediaType, data}")
    for key in item:
        if key not in _KEYS:
            raise InvalidParams(_field(i, str(key)),
                                "unknown key (accepted: name, mediaType, data)")
    for key in ("name", "mediaType", "data"):
        if not isinstance(item.get(key), str):
            raise InvalidParams(_field(i, key), "is required and must be a string")
    name: str = item["name"].strip()
    if not name or len(name) > _MAX_NAME_CHARS or _CONTROL.search(name):
        raise InvalidParams(_field(i, "name"),
                            f"must be 1 to {_MAX_NAME_CHARS} characters, no control characters")
    limit = config.max_attachment_bytes
    encoded: str = item["data"]
    # Refused before decoding: base64 holds 3 bytes in every 4 characters.
    if (len(encoded) // 4) * 3 > limit + 3:
        raise InvalidParams(_field(i, "data"), f"is over {limit} bytes (chat.max_attachment_bytes)")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidParams(_field(i, "data"), "is not valid base64") from None
    if len(data) > limit:
        raise InvalidParams(_field(i, "data"), f"is {len(data)} bytes; the limit is {limit} "
                            "(chat.max_attachment_bytes)")
    if not data:
        raise InvalidParams(_field(i, "data"), "is empty")
    for offset, magic, what in _ARCHIVES:
        if data[offset:offset + len(magic)] == magic:
            raise InvalidParams(_field(i, "data"), f"is an archive ({what}); archives are not "
                                "accepted: attach the files inside it")
    media_type = item["mediaType"].split(";", 1)[0].strip().lower()
    kind = _kind(i, media_type)
    if kind == "text":
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise InvalidParams(_field(i, "data"),
                                f"is declared {media_type} but is not UTF-8 text") from None
        if "\x00" in text:
            raise InvalidParams(_field(i, "data"),
                                f"is declared {media_type} but holds NUL bytes (binary)")
        return Upload(name, media_type, data, kind, text[: config.attachment_text_chars])
    if kind == "image":
        ok = any(data.startswith(m) for m in IMAGE_TYPES[media_type])
        if media_type == "image/webp":
            ok = ok and data[8:12] == b"WEBP"
        if not ok:
            raise InvalidParams(_field(i, "data"), f"is declared {media_type} but is not one (its "
                                "first bytes do not match the format)")
        return Upload(name, media_type, data, kind)
    if b"%PDF-" not in data[:1024]:
        raise InvalidParams(_field(i, "data"), "is declared application/pdf but is not a PDF")
    return Upload(name, media_type, data, kind)


def _kind(i: int, media_type: str) -> Kind:
    if media_type.startswith("text/") or media_type in _TEXT_APPLICATION:
        return "text"
    if media_type == "application/pdf":
        return "pdf"
    if media_type in IMAGE_TYPES:
        return "image"
    raise InvalidParams(_field(i, "mediaType"), f"{media_type or '(empty)'} is not accepted; send "
                        f"text (text/*, source code), application/pdf or {', '.join(IMAGE_TYPES)}")


def pdf_text(i: int, upload: Upload, config: ChatConfig) -> Upload:
    """``upload`` (a PDF) with its text: at most ``chat.attachment_pdf_pages`` pages and
    ``chat.attachment_text_chars`` characters, read within ``chat.attachment_timeout_s``.
    Blocking: call it in a worker thread."""
    from pypdf import PdfReader  # loaded on the first PDF only

    deadline = time.monotonic() + config.attachment_timeout_s
    field = _field(i, "data")
    try:
        reader = PdfReader(io.BytesIO(upload.data))
        if reader.is_encrypted:
            raise InvalidParams(field, "is an encrypted PDF; send it without a password")
        parts: list[str] = []
        size = 0
        for n, page in enumerate(reader.pages):
            if n >= config.attachment_pdf_pages or size >= config.attachment_text_chars:
                break
            if time.monotonic() > deadline:
                raise InvalidParams(field, f"took over {config.attachment_timeout_s} s to read "
                                    "(chat.attachment_timeout_s); the PDF is refused")
            text = page.extract_text() or ""
            parts.append(text)
            size += len(text)
    except InvalidParams:
        raise
    except Exception as exc:  # noqa: BLE001 - pypdf raises many kinds on a broken file
        raise InvalidParams(field, f"is not a readable PDF ({type(exc).__name__})") from None
    text = "\n\n".join(p.strip() for p in parts if p.strip())
    return Upload(upload.name, upload.media_type, upload.data, upload.kind,
                  text[: config.attachment_text_chars])


def line_meta(upload: Upload, sha256: str) -> dict[str, Any]:
    """What the user's transcript line keeps of one attachment (never its bytes)."""
    meta: dict[str, Any] = {"name": upload.name, "mediaType": upload.media_type, "sha256": sha256,
                            "bytes": len(upload.data)}
    if upload.text is not None:
        meta["text"] = upload.text
    return meta


def text_block(content: str, attachments: Sequence[Any]) -> str:
    """A user message's text with its text files' (and PDFs') text after it, each under a
    ``[file: name]`` header, as the model is given it."""
    parts = [content] if content else []
    for meta in attachments:
        if isinstance(meta, dict) and isinstance(meta.get("text"), str):
            parts.append(f"[file: {meta.get('name')}]\n{meta['text']}")
    return "\n\n".join(parts)
