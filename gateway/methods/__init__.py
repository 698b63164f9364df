"""The wire surface: one handler object per namespace, each method declared once beside its
params, with bounds read from the config the store and the memory service enforce.

:func:`declare_methods` declares every v1 method; a namespace given as ``None`` is declared
without handlers (listed by ``rpc.discover``, answering -32601). ``sessions.import`` is built
here from the sessions handler's store, hub and memory, so the composition root passes nothing
more for it.
"""

from __future__ import annotations

from gateway.config import Config
from gateway.methods.chat import ChatMethods, declare_chat
from gateway.methods.episodes import EpisodesMethods, declare_episodes
from gateway.methods.facts import FactsMethods, declare_facts
from gateway.methods.forget import ForgetMethods, declare_forget
from gateway.methods.gateway import GatewayMethods, declare_gateway
from gateway.methods.importing import ImportMethods, declare_importing
from gateway.methods.memory import MemoryMethods, declare_memory
from gateway.methods.sessions import SessionsMethods, declare_sessions
from gateway.rpc import ByteRate, Registry

__all__ = ["ChatMethods", "EpisodesMethods", "FactsMethods", "ForgetMethods", "GatewayMethods",
           "ImportMethods", "MemoryMethods", "SessionsMethods", "declare_methods"]


def declare_methods(
    registry: Registry,
    config: Config,
    *,
    gateway: GatewayMethods | None = None,
    sessions: SessionsMethods | None = None,
    chat: ChatMethods | None = None,
    memory: MemoryMethods | None = None,
    facts: FactsMethods | None = None,
    forget: ForgetMethods | None = None,
    episodes: EpisodesMethods | None = None,
) -> None:
    declare_gateway(registry, gateway)
    declare_sessions(registry, config.sessions, sessions, config.llm)
    declare_importing(registry, _importer(config, sessions), max_data_chars=config.server.max_size)
    declare_chat(registry, config.chat, chat)
    declare_memory(registry, config.memory, memory)
    declare_facts(registry, config.memory, facts)
    declare_forget(registry, forget)
    declare_episodes(registry, episodes)


def _importer(config: Config, sessions: SessionsMethods | None) -> ImportMethods | None:
    """``sessions.import`` over the store, hub, memory and models the sessions handler has."""
    if sessions is None:
        return None
    rate = ByteRate(config.quotas.import_bytes_per_minute, "quotas.import_bytes_per_minute",
                    largest=config.server.max_size)
    return ImportMethods(sessions.store, sessions.hub, sessions.memory, sessions.models, rate)
