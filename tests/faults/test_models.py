"""Sessions run only on models the operator offers (llm.models, the configured model by
default), since every request goes out on the operator's key; models.list tells clients
which (issue 22, N9)."""

from __future__ import annotations

from collections.abc import Callable

from gateway.client import Client
from gateway.config import Config
from tests.conftest import TOKEN, running


async def test_a_model_not_offered_is_refused(config_factory: Callable[..., Config]) -> None:
    """By default only llm.model may be chosen: sessions.create with another answers -32602
    naming llm.models and creates nothing; models.list says what is offered."""
    async with running(config_factory(llm={"model": "cheap-model"})) as app, \
            Client.connect(app.url, TOKEN) as c:
        assert await c.call("models.list") == {"models": ["cheap-model"], "default": "cheap-model"}
        reply = await c.request("sessions.create", {"model": "o1-pro-2025-03-19"})
        error = reply["error"]
        assert error["code"] == -32602 and "llm.models" in error["message"], error
        assert error["data"]["field"] == "model"
        assert (await c.call("sessions.list"))["sessions"] == []
        assert (await c.call("sessions.create", {"model": "cheap-model"}))["sessionKey"]
        assert (await c.call("sessions.create"))["sessionKey"]


async def test_listed_models_may_be_chosen(config_factory: Callable[..., Config]) -> None:
    """With llm.models set, each listed model may be chosen, the configured one stays the
    default and comes first, and rpc.discover describes models.list's result."""
    cfg = config_factory(llm={"model": "cheap-model",
                              "models": ["big-model", "cheap-model", "other"]})
    async with running(cfg) as app, Client.connect(app.url, TOKEN) as c:
        assert await c.call("models.list") == {"models": ["cheap-model", "big-model", "other"],
                                               "default": "cheap-model"}
        key = (await c.call("sessions.create", {"model": "big-model"}))["sessionKey"]
        assert (await c.call("sessions.get", {"sessionKey": key}))["model"] == "big-model"
        assert (await c.request("sessions.create",
                                {"model": "unlisted"}))["error"]["code"] == -32602
        methods = {m["name"]: m for m in (await c.call("rpc.discover"))["methods"]}
        props = methods["models.list"]["result"]["schema"]["properties"]
        assert set(props) == {"models", "default"}
