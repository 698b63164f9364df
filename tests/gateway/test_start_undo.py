"""A start that fails or is cancelled part-way closes what it opened: the data-dir lock, the
sessions store and the memory index, so the same process can start again."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import gateway.app
from gateway.app import start_app
from gateway.config import Config


def _open_files(under: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(under)):
            found.append(target)
    return sorted(found)


async def _starts_again(config: Config) -> None:
    app = await start_app(config)
    await app.close()


async def test_a_start_whose_audit_fails_closes_the_store_memory_and_lock(
        config_factory: Callable[..., Config], monkeypatch: pytest.MonkeyPatch) -> None:
    """The mode audit raising after the store and memory opened: the error reaches the caller,
    nothing under the data dir stays open, and a second start succeeds."""
    config = config_factory()

    def broken_audit(data_dir: Path) -> None:
        raise PermissionError("cannot read a folder of the data dir")

    monkeypatch.setattr(gateway.app, "_warn_if_exposed", broken_audit)
    with pytest.raises(PermissionError):
        await start_app(config)
    assert _open_files(config.data_dir) == []
    monkeypatch.undo()
    await _starts_again(config)


async def test_a_cancelled_start_closes_the_store_memory_and_lock(
        config_factory: Callable[..., Config], monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled while the audit still runs (store and memory open): the cancellation reaches
    the caller, nothing under the data dir stays open, and a second start succeeds."""
    config = config_factory()
    audit_started, release = threading.Event(), threading.Event()

    def slow_audit(data_dir: Path) -> None:
        audit_started.set()
        release.wait(10)

    monkeypatch.setattr(gateway.app, "_warn_if_exposed", slow_audit)
    start = asyncio.create_task(start_app(config))
    await asyncio.to_thread(audit_started.wait, 10)
    while not any(p.endswith("sessions.db") for p in _open_files(config.data_dir)):
        await asyncio.sleep(0.01)  # the store is open: the start now waits for the audit alone
    start.cancel()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await start
    assert _open_files(config.data_dir) == []
    monkeypatch.undo()
    await _starts_again(config)
