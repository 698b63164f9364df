"""The method registry: names, typed parameter schemas, handlers, and the OpenRPC document.

A method's params are a frozen dataclass. Wire keys are camelCase, fields snake_case;
:func:`parse_params` checks presence, types and declared bounds and raises
:class:`InvalidParams` naming the field, so handlers receive clean values. ``rpc.discover``
is generated from the same dataclasses, so the document never drifts from the code.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.errors import InvalidParams, MethodNotFound

__all__ = [
    "Method",
    "Registry",
    "bounded",
    "parse_params",
]

Handler = Callable[[Any, Any], Awaitable[Any]]


def bounded(
    default: Any = dataclasses.MISSING,
    *,
    min: float | None = None,
    max: float | None = None,
    max_len: int | None = None,
    doc: str = "",
) -> Any:
    """A dataclass field with bounds the validator enforces and OpenRPC publishes."""
    meta = {"min": min, "max": max, "max_len": max_len, "doc": doc}
    if default is dataclasses.MISSING:
        return field(metadata=meta)
    return field(default=default, metadata=meta)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    params: type[Any]
    summary: str
    result: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    handler: Handler | None = None
    requires_auth: bool = True
    # True for handlers that never wait on I/O: the server runs them without a task.
    inline: bool = False


class Registry:
    """Holds every method; later packages fill in handlers with :meth:`implement`."""

    def __init__(self) -> None:
        self._methods: dict[str, Method] = {}

    def declare(
        self,
        name: str,
        params: type[Any],
        summary: str,
        *,
        result: dict[str, Any] | None = None,
        requires_auth: bool = True,
        inline: bool = False,
    ) -> None:
        if name in self._methods:
            raise ValueError(f"method {name} declared twice")
        self._methods[name] = Method(
            name, params, summary, result or {"type": "object"}, None, requires_auth, inline
        )

    def implement(self, name: str, handler: Handler) -> None:
        self._methods[name] = dataclasses.replace(self._methods[name], handler=handler)

    def is_inline(self, name: Any) -> bool:
        method = self._methods.get(name) if isinstance(name, str) else None
        return method is not None and method.inline

    def get(self, name: str) -> Method:
        try:
            return self._methods[name]
        except KeyError:
            raise MethodNotFound(f"method not found: {name}") from None

    def __iter__(self) -> typing.Iterator[Method]:
        return iter(sorted(self._methods.values(), key=lambda m: m.name))

    def openrpc(self, version: str) -> dict[str, Any]:
        """An OpenRPC 1.2 document generated from the declared methods."""
        return {
            "openrpc": "1.2.6",
            "info": {"title": "recalld gateway", "version": version},
            "methods": [
                {
                    "name": m.name,
                    "summary": m.summary,
                    "paramStructure": "by-name",
                    "params": _params_schema(m.params),
                    "result": {"name": "result", "schema": m.result},
                    **({} if m.handler else {"x-implemented": False}),
                }
                for m in self
            ],
        }


def _params_schema(cls: type[Any]) -> list[dict[str, Any]]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        args = typing.get_args(tp)
        optional = typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args
        if optional:
            tp = next(a for a in args if a is not type(None))
        schema = _json_schema(tp)
        meta = f.metadata
        for key, json_key in (("min", "minimum"), ("max", "maximum"), ("max_len", "maxLength")):
            if meta.get(key) is not None:
                schema[json_key] = meta[key]
        if optional:
            schema = {"oneOf": [schema, {"type": "null"}]}
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        entry: dict[str, Any] = {"name": _camel(f.name), "required": required, "schema": schema}
        if meta.get("doc"):
            entry["description"] = meta["doc"]
        out.append(entry)
    return out


def _json_schema(tp: Any) -> dict[str, Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return {"enum": list(args)}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    return {}


@dataclass(frozen=True, slots=True)
class _FieldSpec:
    wire: str
    name: str
    type: Any
    meta: typing.Mapping[str, Any]
    required: bool


_SPECS: dict[type[Any], tuple[dict[str, _FieldSpec], str]] = {}


def _spec(cls: type[Any]) -> tuple[dict[str, _FieldSpec], str]:
    """Per params class, computed once: evaluating type hints costs more than the whole call."""
    cached = _SPECS.get(cls)
    if cached is not None:
        return cached
    hints = typing.get_type_hints(cls)
    fields = {
        _camel(f.name): _FieldSpec(
            _camel(f.name), f.name, hints[f.name], f.metadata,
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    }
    _SPECS[cls] = fields, ", ".join(fields) or "none"
    return _SPECS[cls]


def parse_params(cls: type[Any], params: Any) -> Any:
    """Validate wire params (a camelCase object, or absent) into an instance of ``cls``."""
    if params is None:
        params = {}
    if isinstance(params, list):
        raise InvalidParams("params", "must be an object (by-name); arrays are not accepted")
    if not isinstance(params, dict):
        raise InvalidParams("params", "must be an object")
    fields, known = _spec(cls)
    for key in params:
        if key not in fields:
            raise InvalidParams(str(key), f"unknown parameter (accepted: {known})")
    kwargs: dict[str, Any] = {}
    for wire, f in fields.items():
        if wire not in params:
            if f.required:
                raise InvalidParams(wire, "is required")
            continue
        kwargs[f.name] = _check(wire, f.type, params[wire], f.meta)
    return cls(**kwargs)


def _check(name: str, tp: Any, value: Any, meta: typing.Mapping[str, Any]) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        tp = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        if value not in args:
            raise InvalidParams(name, f"must be one of {', '.join(map(repr, args))}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise InvalidParams(name, "must be a boolean")
    elif tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidParams(name, "must be an integer")
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidParams(name, "must be a number")
        value = float(value)
    elif tp is str:
        if not isinstance(value, str):
            raise InvalidParams(name, "must be a string")
        max_len = meta.get("max_len")
        if max_len is not None and len(value) > max_len:
            raise InvalidParams(name, f"is too long ({len(value)} > {max_len} characters)")
    if isinstance(value, int | float) and not isinstance(value, bool):
        lo, hi = meta.get("min"), meta.get("max")
        if lo is not None and value < lo:
            raise InvalidParams(name, f"must be >= {lo}")
        if hi is not None and value > hi:
            raise InvalidParams(name, f"must be <= {hi}")
    return value
