"""chat.send attachments end to end: real gateway, real openai SDK against the loopback fake
model, real files in the data dir, real pypdf."""

from __future__ import annotations

import base64
import hashlib
import io
import stat
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.client import Client, RpcError
from gateway.config import Config
from tests.conftest import TOKEN, running
from tests.daemon import Daemon
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_chat import run_to_end, transcript
from tests.gateway.test_cli_chat import chat
from tests.gateway.test_memory_methods import search_until

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\rIHDR" + b"\x00" * 17


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def llm(fake: FakeOpenAI, **more: Any) -> dict[str, Any]:
    return {"base_url": fake.base_url, "api_key": "sk-test", "model": "fake-model",
            "max_retries": 0, **more}


def pdf_with_text(text: str) -> bytes:
    """A minimal one-page PDF whose page shows ``text`` (Helvetica), with a correct xref."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += (b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n"
            % (len(objects) + 1, xref))
    return bytes(out)


async def send(c: Client, key: str, message: str,
               attachments: list[dict[str, Any]]) -> dict[str, Any]:
    run_id = (await c.call("chat.send", {"sessionKey": key, "message": message,
                                         "attachments": attachments}))["runId"]
    return (await run_to_end(c, run_id))[1]


async def test_text_file_is_stored_shown_and_given_to_the_model(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A text file is stored 0600 under its SHA-256, named on the user line without its bytes,
    returned by sessions.history/sessions.attachment, given to the model under its name, and
    deleted with the session."""
    body = b"Quarterly plan: ship the zebrafish feature.\n"
    sha = hashlib.sha256(body).hexdigest()
    cfg = config_factory(llm=llm(fake_openai))
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        final = await send(c, key, "Summarise this",
                           [{"name": "plan.txt", "mediaType": "text/plain", "data": b64(body)}])
        assert final["method"] == "chat.final"
        sent = fake_openai.chat_requests[-1].json["messages"][-1]
        assert sent["role"] == "user"
        assert sent["content"].startswith("Summarise this\n\n[file: plan.txt]\n")
        assert "zebrafish feature" in sent["content"]
        line = transcript(app, key)[1]
        assert line["attachments"][0] == {"name": "plan.txt", "mediaType": "text/plain",
                                          "sha256": sha, "bytes": len(body), "text": body.decode()}
        stored = app.config.data_dir / "attachments" / "default" / key / sha
        assert stored.read_bytes() == body
        assert stat.S_IMODE(stored.stat().st_mode) == 0o600
        assert stat.S_IMODE(stored.parent.stat().st_mode) == 0o700
        history = await c.call("sessions.history", {"sessionKey": key})
        assert history["messages"][0]["attachments"][0]["sha256"] == sha
        got = await c.call("sessions.attachment", {"sessionKey": key, "sha256": sha})
        assert base64.b64decode(got["data"]) == body and got["bytes"] == len(body)
        with pytest.raises(RpcError) as missing:
            await c.call("sessions.attachment", {"sessionKey": key, "sha256": "0" * 64})
        assert missing.value.code == -32602 and "sha256" in missing.value.message
        other = (await c.call("sessions.create"))["sessionKey"]
        with pytest.raises(RpcError):  # the file is the other session's, not this one's
            await c.call("sessions.attachment", {"sessionKey": other, "sha256": sha})
        await c.call("sessions.delete", {"sessionKey": key})
        assert not stored.parent.exists()


@pytest.mark.parametrize(("attachment", "field", "words"), [
    ({"name": "a.png", "mediaType": "image/png", "data": b64(b"just text")}, "attachments[0].data",
     "not one"),
    ({"name": "a.txt", "mediaType": "text/plain", "data": b64(b"\xff\xfe\xfa bad")},
     "attachments[0].data", "not UTF-8"),
    ({"name": "a.zip", "mediaType": "text/plain", "data": b64(b"PK\x03\x04rest")},
     "attachments[0].data", "archive (zip)"),
    ({"name": "a.exe", "mediaType": "application/octet-stream", "data": b64(b"MZ")},
     "attachments[0].mediaType", "not accepted"),
    ({"name": "big.txt", "mediaType": "text/plain", "data": b64(b"x" * 2048)},
     "attachments[0].data", "chat.max_attachment_bytes"),
    ({"name": "a.txt", "mediaType": "text/plain", "data": "not base64!"}, "attachments[0].data",
     "base64"),
    ({"name": "a.pdf", "mediaType": "application/pdf", "data": b64(b"%PDF-1.4 broken")},
     "attachments[0].data", "not a readable PDF"),
    ({"name": "x.txt", "mediaType": "text/plain"}, "attachments[0].data", "required"),
])
async def test_hostile_files_are_refused_naming_the_field(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI, attachment: dict[str, Any],
    field: str, words: str,
) -> None:
    """A file whose bytes belie its type, an archive, an oversize or undecodable file or a broken
    PDF answers -32602 naming the field, and nothing is appended or stored."""
    cfg = config_factory(llm=llm(fake_openai), chat={"max_attachment_bytes": 1024})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        with pytest.raises(RpcError) as err:
            await c.call("chat.send",
                         {"sessionKey": key, "message": "hi", "attachments": [attachment]})
        assert err.value.code == -32602
        assert err.value.data["field"] == field and words in err.value.message
        assert (await c.call("sessions.history", {"sessionKey": key}))["messages"] == []
        assert not (app.config.data_dir / "attachments" / "default" / key).exists()
        assert not fake_openai.chat_requests


async def test_too_many_files_are_refused(config_factory: Callable[..., Config],
                                          fake_openai: FakeOpenAI) -> None:
    """More files than chat.max_attachments answer -32602 naming attachments and the setting."""
    cfg = config_factory(llm=llm(fake_openai), chat={"max_attachments": 2})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        one = {"name": "a.txt", "mediaType": "text/plain", "data": b64(b"a")}
        with pytest.raises(RpcError) as err:
            await c.call("chat.send",
                         {"sessionKey": key, "message": "hi", "attachments": [one, one, one]})
        assert err.value.code == -32602 and "chat.max_attachments" in err.value.message


async def test_an_image_needs_a_vision_model(config_factory: Callable[..., Config],
                                             fake_openai: FakeOpenAI) -> None:
    """An image for a model not in llm.vision_models answers -32602 before anything is appended."""
    cfg = config_factory(llm=llm(fake_openai))
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        with pytest.raises(RpcError) as err:
            await c.call("chat.send", {"sessionKey": key, "message": "look",
                                       "attachments": [{"name": "p.png", "mediaType": "image/png",
                                                        "data": b64(PNG)}]})
        assert err.value.code == -32602 and "does not take images" in err.value.message
        assert (await c.call("sessions.history", {"sessionKey": key}))["messages"] == []
        assert not (app.config.data_dir / "attachments" / "default" / key).exists()


async def test_an_image_reaches_a_vision_model_as_an_image_part(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """On a model listed in llm.vision_models an image goes out as an image_url data-URL part."""
    cfg = config_factory(llm=llm(fake_openai, vision_models=["fake-model"]))
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        final = await send(c, key, "what is it?",
                           [{"name": "p.png", "mediaType": "image/png", "data": b64(PNG)}])
        assert final["method"] == "chat.final"
        content = fake_openai.chat_requests[-1].json["messages"][-1]["content"]
        assert content[0] == {"type": "text", "text": "what is it?"}
        assert content[1] == {"type": "image_url",
                              "image_url": {"url": "data:image/png;base64," + b64(PNG)}}


async def test_pdf_text_reaches_the_model(config_factory: Callable[..., Config],
                                          fake_openai: FakeOpenAI) -> None:
    """A PDF's text is extracted with pypdf, kept on the line and given to the model; an
    encrypted PDF answers -32602."""
    from pypdf import PdfWriter

    cfg = config_factory(llm=llm(fake_openai))
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await send(c, key, "", [{"name": "memo.pdf", "mediaType": "application/pdf",
                                 "data": b64(pdf_with_text("The budget is 42 kumquats"))}])
        sent = fake_openai.chat_requests[-1].json["messages"][-1]["content"]
        assert sent.startswith("[file: memo.pdf]\n") and "42 kumquats" in sent
        assert "42 kumquats" in transcript(app, key)[1]["attachments"][0]["text"]
        writer = PdfWriter()
        writer.add_blank_page(72, 72)
        writer.encrypt("secret")
        locked = io.BytesIO()
        writer.write(locked)
        with pytest.raises(RpcError) as err:
            await c.call("chat.send", {"sessionKey": key, "message": "and this",
                                       "attachments": [{"name": "l.pdf",
                                                        "mediaType": "application/pdf",
                                                        "data": b64(locked.getvalue())}]})
        assert err.value.code == -32602 and "encrypted" in err.value.message


async def test_memory_search_finds_a_word_only_in_the_file(
    config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """A text file's words are indexed with the message, the file named in the chunk."""
    cfg = config_factory(llm=llm(fake_openai), memory={"debounce_ms": 20, "embedder": "none"})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        await send(c, key, "here are my notes", [{"name": "notes.md", "mediaType": "text/markdown",
                                                  "data": b64(b"The password hint is xylophone.")}])
        found = await search_until(c, {"query": "xylophone"})
        top = found["results"][0]
        assert top["sessionKey"] == key and "[file: notes.md]" in top["content"]


async def test_both_backends_keep_return_and_delete_files(
    backend_config_factory: Callable[..., Config], fake_openai: FakeOpenAI
) -> None:
    """On SQLite + JSONL and on PostgreSQL a file is kept with its session, returned by
    sessions.attachment, gone with the forgotten message it came with, and deleted with
    the session."""
    cfg = backend_config_factory(llm=llm(fake_openai))
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        key = (await c.call("sessions.create"))["sessionKey"]
        final = await send(c, key, "hi",
                           [{"name": "a.txt", "mediaType": "text/plain", "data": b64(b"hello")}])
        assert final["method"] == "chat.final"
        sha = hashlib.sha256(b"hello").hexdigest()
        history = await c.call("sessions.history", {"sessionKey": key})
        assert history["messages"][0]["attachments"][0]["sha256"] == sha
        got = await c.call("sessions.attachment", {"sessionKey": key, "sha256": sha})
        assert base64.b64decode(got["data"]) == b"hello"
        await c.call("memory.forget", {"sessionKey": key, "purgeTranscript": True})
        with pytest.raises(RpcError) as gone:
            await c.call("sessions.attachment", {"sessionKey": key, "sha256": sha})
        assert gone.value.code == -32602
        await send(c, key, "again",
                   [{"name": "a.txt", "mediaType": "text/plain", "data": b64(b"hello")}])
        await c.call("sessions.delete", {"sessionKey": key})
        with pytest.raises(RpcError) as deleted:
            await c.call("sessions.attachment", {"sessionKey": key, "sha256": sha})
        assert deleted.value.code == -32002


@pytest.fixture
def cli_daemon(tmp_path: Path, fake_openai: FakeOpenAI) -> Iterator[Daemon]:
    d = Daemon(tmp_path / "data",
               env={"OPENAI_BASE_URL": fake_openai.base_url, "RECALLD_LLM_MODEL": "fake-model"})
    yield d
    d.kill()


async def test_cli_attach_sends_the_file_with_the_next_message(
    cli_daemon: Daemon, fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    """`recalld chat`'s /attach PATH sends that file with the next line; a missing file is an
    error line."""
    notes = tmp_path / "todo.md"
    notes.write_text("- water the begonias\n")
    code, out, err = await chat(
        cli_daemon, stdin=f"/attach {notes}\n/attach {tmp_path / 'nope.txt'}\nwhat is on it?\n")
    assert code == 0, err
    assert "attached todo.md (text/markdown" in out and "cannot read" in err
    sent = fake_openai.chat_requests[-1].json["messages"][-1]["content"]
    assert sent.startswith("what is on it?\n\n[file: todo.md]\n") and "begonias" in sent


def test_purged_messages_take_their_files_and_a_deleted_session_all(tmp_path: Path) -> None:
    """SessionStore.purge_messages removes the files only forgotten lines named; delete removes
    the rest."""
    from sessions import SessionStore

    with SessionStore(tmp_path) as store:
        key = store.create("default").session_key
        files = store.attachments
        gone, kept = files.put("default", key, b"forget me"), files.put("default", key, b"keep me")
        meta = [{"name": "a.txt", "mediaType": "text/plain", "bytes": 1}]
        store.append_message("default", key, role="user", content="old", ts="2020-01-01T00:00:00Z",
                             extra={"attachments": [{**meta[0], "sha256": gone}]})
        store.append_message("default", key, role="user", content="new",
                             extra={"attachments": [{**meta[0], "sha256": kept}]})
        store.purge_messages("default", key, before=datetime(2021, 1, 1, tzinfo=UTC))
        folder = tmp_path / "attachments" / "default" / key
        assert sorted(p.name for p in folder.iterdir()) == [kept]
        store.delete("default", key)
        assert not folder.exists()
