"""The recalld daemon: WebSocket transport, JSON-RPC core, method handlers, chat runs, CLI.

Rooms: ``transport/`` (the socket), ``rpc/`` (JSON-RPC, no I/O), ``methods/`` (one handler
object per namespace), ``chat/`` (runs, prompt, model client, event hub), ``cli/``; ``app.py``
wires them. See docs/architecture.md for the arrows allowed between them.
"""
