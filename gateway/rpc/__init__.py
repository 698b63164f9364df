"""JSON-RPC 2.0 without I/O: the method registry (params, bounds, OpenRPC), the core that
turns one frame into one reply, and the reply budget both single calls and batches run within.
Imports nothing of the transport, chat or methods."""

from __future__ import annotations

from gateway.rpc.budget import ReplyBudget, UserBudgets, over_budget
from gateway.rpc.context import CallContext, Notification, Reply
from gateway.rpc.core import Call, RpcCore
from gateway.rpc.fairness import CALLER, FairThreads, UserSlots, fair_threads
from gateway.rpc.quota import ByteRate, Quotas, written_size
from gateway.rpc.registry import (
    Bound,
    Handler,
    Method,
    OpenRpcDocument,
    Registry,
    bounded,
    parse_params,
)

__all__ = [
    "CALLER",
    "Bound",
    "ByteRate",
    "Call",
    "CallContext",
    "FairThreads",
    "Handler",
    "Method",
    "Notification",
    "OpenRpcDocument",
    "Quotas",
    "Reply",
    "Registry",
    "ReplyBudget",
    "RpcCore",
    "UserBudgets",
    "UserSlots",
    "bounded",
    "fair_threads",
    "over_budget",
    "parse_params",
    "written_size",
]
