"""Items 12–14 of issue 10: `recalld call` and `recalld chat` reach a wss:// daemon (system CA
store or ``--cacert``), find a daemon started on another port through its data dir or
``$RECALLD_URL``, take the token from a file, and accept the global flags after the command."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.client import Client
from gateway.runtime import RUNTIME_FILE, read_runtime_url
from tests.conftest import TOKEN
from tests.daemon import Daemon
from tests.fake_openai import FakeOpenAI


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RECALLD_", "OPENAI_"))}
    env.update(extra)
    return env


async def recalld(*args: str, stdin: str = "",
                  env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """The CLI as a child process; awaited, so this loop keeps serving the fake model
    meanwhile."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", *args, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env or _clean_env(),
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key (PEM files)."""
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor openssl is available to make a "
                        "certificate")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
             "-nodes", "-days", "2", "-subj", "/CN=localhost", "-keyout", str(key_path),
             "-out", str(cert_path), "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
            check=True, capture_output=True,
        )
        return cert_path, key_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


@pytest.fixture
def tls_daemon(tmp_path: Path, fake_openai: FakeOpenAI) -> Iterator[tuple[Daemon, str, Path]]:
    cert, key = self_signed(tmp_path)
    d = Daemon(tmp_path / "data", env={"RECALLD_TLS_CERT": str(cert), "RECALLD_TLS_KEY": str(key),
                                      "OPENAI_BASE_URL": fake_openai.base_url,
                                      "RECALLD_LLM_MODEL": "fake-model"})
    yield d, f"wss://127.0.0.1:{d.port}/", cert
    d.kill()


async def test_call_and_chat_work_over_wss_with_cacert(
    tls_daemon: tuple[Daemon, str, Path], tmp_path: Path
) -> None:
    """Against a wss:// daemon with a self-signed certificate, `recalld call` and `recalld chat`
    connect with --cacert and --token-file; without --cacert they fail with one line, no
    traceback."""
    daemon, url, cert = tls_daemon
    token_file = tmp_path / "client-token"
    token_file.write_text(TOKEN + "\n")
    # A data dir of the client's own: nothing of the daemon's config can help it.
    client_dir = str(tmp_path / "client")
    common = ("--data-dir", client_dir, "--url", url, "--token-file", str(token_file))

    code, out, err = await recalld("call", "gateway.health", *common, "--cacert", str(cert))
    assert code == 0, err
    assert json.loads(out)["status"] == "ok"

    code, out, err = await recalld("chat", *common, "--cacert", str(cert), stdin="hello over tls\n")
    assert code == 0, err
    assert "Echo: hello over tls\n" in out and "Traceback" not in err

    for command in ("call", "chat"):
        args = ("call", "gateway.health") if command == "call" else ("chat",)
        code, out, err = await recalld(*args, *common, stdin="never sent\n")
        assert code == 1, (out, err)
        assert "certificate verify failed" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err


async def test_clients_find_a_daemon_on_port_0_through_the_data_dir(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    """With the daemon on a port the OS picked, `call` and `chat` given only the data dir (after
    the command) reach it and take its generated token; $RECALLD_URL works from anywhere."""
    data = tmp_path / "data"
    daemon = Daemon(data, env={"RECALLD_TOKEN": "", "OPENAI_BASE_URL": fake_openai.base_url,
                               "RECALLD_LLM_MODEL": "fake-model"})
    try:
        # The daemon logs "listening" a moment before it writes daemon.json.
        deadline = time.monotonic() + 30
        while read_runtime_url(data) is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert read_runtime_url(data) == daemon.url
        code, out, err = await recalld("call", "gateway.health", "--data-dir", str(data))
        assert code == 0, err
        assert json.loads(out)["status"] == "ok"
        code, out, err = await recalld("chat", "--data-dir", str(data), stdin="found you\n")
        assert code == 0, err
        assert "Echo: found you\n" in out
        token = (data / "token").read_text().strip()
        code, out, err = await recalld("--data-dir", str(tmp_path / "elsewhere"), "call",
                                       "gateway.health",
                                       env=_clean_env(RECALLD_URL=daemon.url, RECALLD_TOKEN=token))
        assert code == 0, err
    finally:
        daemon.stop()
    assert not (data / RUNTIME_FILE).exists(), ("the daemon left its address behind after a clean "
                                                "stop")


def test_serve_accepts_the_data_dir_after_the_command(tmp_path: Path) -> None:
    """`recalld serve --data-dir D --port 0` serves D, exactly like `recalld --data-dir D serve`."""
    data = tmp_path / "after"
    proc = subprocess.Popen([sys.executable, "-m", "gateway", "serve", "--data-dir", str(data),
                             "--port", "0"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE,
                            env=_clean_env(RECALLD_TOKEN=TOKEN, RECALLD_MEMORY_EMBEDDER="none"),
                            text=True)
    try:
        deadline = time.monotonic() + 30
        while (url := read_runtime_url(data)) is None:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, ("the daemon never wrote its address into the "
                                                 "data dir")
            time.sleep(0.05)

        async def health() -> str:
            async with Client.connect(url, TOKEN) as c:
                return str((await c.call("gateway.health"))["status"])

        assert asyncio.run(health()) == "ok"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_a_stale_address_file_is_ignored(tmp_path: Path) -> None:
    """A daemon.json left by a daemon killed with -9 (its pid gone) does not steer the client."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           capture_output=True, text=True)
    gone = int(child.stdout)
    (tmp_path / RUNTIME_FILE).write_text(json.dumps({"url": "ws://127.0.0.1:9/", "pid": gone}))
    assert read_runtime_url(tmp_path) is None


async def test_an_empty_token_file_is_one_clear_line(tmp_path: Path) -> None:
    """--token-file naming an empty or missing file stops with one line naming the file, exit 2."""
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for path, words in ((empty, "is empty"), (tmp_path / "missing", "cannot read the token file")):
        code, _, err = await recalld("call", "gateway.health", "--data-dir", str(tmp_path),
                                     "--url", "ws://127.0.0.1:9/", "--token-file", str(path))
        assert (code == 2 and words in err and str(path) in err
                and len(err.strip().splitlines()) == 1), err


async def test_global_flags_work_after_every_command(tmp_path: Path) -> None:
    """`token --data-dir D` and `memory status --data-dir D` act on D, like the flag before the
    command."""
    data = tmp_path / "data"
    code, out, err = await recalld("token", "--data-dir", str(data))
    assert code == 0, err
    assert out.strip() == (data / "token").read_text().strip()
    code, out, err = await recalld("memory", "status", "--json", "--data-dir", str(data),
                                   env=_clean_env(RECALLD_MEMORY_EMBEDDER="none"))
    assert code == 0, err
    assert json.loads(out)["dbPath"] == str(data / "memory.db")
