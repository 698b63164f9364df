"""The method registry: names, typed parameter schemas, handlers, and the OpenRPC document.

A method's params are a frozen dataclass. Wire keys are camelCase, fields snake_case;
:func:`parse_params` checks presence, types and bounds and raises :class:`InvalidParams`
naming the field, so handlers receive clean values. Bounds come from two places, merged once
when the method is declared: fixed ones on the field (:func:`bounded`), and ones that depend
on configuration (``sessions.max_page_size``, ``memory.max_k``) passed as ``bounds=`` by the
namespace that declares the method, read from the same config object the store or service
enforces. Validation and ``rpc.discover`` both read the merged spec, so the published schema
and the code cannot disagree.

A method's result is a TypedDict (``result=``); its JSON schema is generated from the type
when the method is declared (:func:`result_schema`), and mypy checks that the handler returns
that type, so ``rpc.discover`` publishes the shape the handler builds.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, Required, TypedDict, TypeVar

from gateway.errors import InvalidParams, MethodNotFound

if typing.TYPE_CHECKING:
    from gateway.rpc.context import CallContext

__all__ = [
    "Bound",
    "Handler",
    "Method",
    "OpenRpcDocument",
    "Registry",
    "bounded",
    "parse_params",
    "result_schema",
]

Handler = Callable[["CallContext", Any], Awaitable[Any]]
P = TypeVar("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Bound:
    """Limits of one parameter that the validator enforces and OpenRPC publishes."""

    min: float | None = None
    max: float | None = None
    max_len: int | None = None


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
class _FieldSpec:
    wire: str
    name: str
    type: Any
    bound: Bound
    doc: str
    required: bool


@dataclass(frozen=True, slots=True)
class Method:
    name: str
    params: type[Any]
    summary: str
    handler: Handler | None
    requires_auth: bool
    # True for handlers that never wait on I/O: the server runs them without a task.
    inline: bool
    # Wire name -> spec, with the bounds merged; computed once here because evaluating type
    # hints costs more than a whole call.
    fields: typing.Mapping[str, _FieldSpec]
    accepted: str  # the wire names, listed when an unknown parameter is refused
    result: typing.Mapping[str, Any]  # the result's JSON schema, generated once from its type
    # Whether the method changes anything (or hands out more than reading would): a read-only
    # client token's connection is refused it (see :func:`_writes`).
    writes: bool = True


class OpenRpcDocument(TypedDict):
    """``rpc.discover``'s result: an OpenRPC 1.2 document."""

    openrpc: str
    info: dict[str, Any]
    methods: list[dict[str, Any]]


class Registry:
    """Every method the gateway answers, declared once with its params and handler.

    A method declared with ``handler=None`` is listed by ``rpc.discover`` (marked
    ``x-implemented: false``) and answers -32601: the daemon does this for ``memory.*`` when
    ``memory.enabled = false``.
    """

    def __init__(self) -> None:
        self._methods: dict[str, Method] = {}

    def declare(
        self,
        name: str,
        params: type[P],
        summary: str,
        handler: Callable[[CallContext, P], Awaitable[R]] | None = None,
        *,
        result: type[R] | None = None,
        bounds: typing.Mapping[str, Bound] | None = None,
        requires_auth: bool = True,
        inline: bool = False,
        writes: bool | None = None,
    ) -> None:
        """Declare a method; ``result`` is the TypedDict its handler returns (a method declared
        without one is published as a bare ``object``). ``writes`` says whether a read-only
        token is refused it; left out, it follows the method's last name part (:func:`_writes`)."""
        if name in self._methods:
            raise ValueError(f"method {name} declared twice")
        fields = _field_specs(params, bounds or {})
        schema = {"type": "object"} if result is None else result_schema(result)
        self._methods[name] = Method(
            name, params, summary, handler, requires_auth, inline, fields,
            ", ".join(fields) or "none", schema, _writes(name) if writes is None else writes,
        )

    def is_inline(self, name: Any) -> bool:
        method = self.find(name)
        return method is not None and method.inline

    def find(self, name: Any) -> Method | None:
        """The method called ``name`` (any JSON value a frame carries), or None: the core
        looks a call's method up once, when the frame is decoded."""
        return self._methods.get(name) if isinstance(name, str) else None

    def get(self, name: str) -> Method:
        try:
            return self._methods[name]
        except KeyError:
            raise MethodNotFound(f"method not found: {name}") from None

    def __iter__(self) -> typing.Iterator[Method]:
        return iter(sorted(self._methods.values(), key=lambda m: m.name))

    def openrpc(self, version: str) -> OpenRpcDocument:
        """An OpenRPC 1.2 document generated from the declared methods."""
        return {
            "openrpc": "1.2.6",
            "info": {"title": "recalld gateway", "version": version},
            "methods": [
                {
                    "name": m.name,
                    "summary": m.summary,
                    "paramStructure": "by-name",
                    "params": [_param_schema(f) for f in m.fields.values()],
                    "result": {"name": "result", "schema": m.result},
                    **({} if m.handler else {"x-implemented": False}),
                    # Refused to a read-only client token (docs/protocol.md, Authentication).
                    **({"x-writes": True} if m.writes else {}),
                }
                for m in self
            ],
        }


# Last name parts of methods that only read. Any other method counts as writing unless declared
# otherwise, so a method added later is refused to read-only tokens until someone decides it
# only reads: failing closed, with no list of methods to keep in step anywhere.
_READ_VERBS = frozenset({"auth", "discover", "get", "health", "history", "list", "search", "status",
                         "subscribe", "unsubscribe", "watch"})


def _writes(name: str) -> bool:
    return name.rsplit(".", 1)[-1] not in _READ_VERBS


def _field_specs(cls: type[Any], bounds: typing.Mapping[str, Bound]) -> dict[str, _FieldSpec]:
    hints = typing.get_type_hints(cls)
    specs: dict[str, _FieldSpec] = {}
    for f in dataclasses.fields(cls):
        wire = _camel(f.name)
        meta = f.metadata
        given = bounds.get(wire, Bound())
        bound = Bound(  # a configured bound wins over the field's fixed one, limit by limit
            given.min if given.min is not None else meta.get("min"),
            given.max if given.max is not None else meta.get("max"),
            given.max_len if given.max_len is not None else meta.get("max_len"),
        )
        specs[wire] = _FieldSpec(
            wire, f.name, hints[f.name], bound, meta.get("doc", ""),
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
    unknown = set(bounds) - set(specs)
    if unknown:
        raise ValueError(f"bounds for unknown parameters {sorted(unknown)} of {cls.__name__}")
    return specs


def _param_schema(f: _FieldSpec) -> dict[str, Any]:
    tp = f.type
    args = typing.get_args(tp)
    optional = typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args
    if optional:
        tp = next(a for a in args if a is not type(None))
    schema = _json_schema(tp)
    for value, json_key in ((f.bound.min, "minimum"), (f.bound.max, "maximum"),
                            (f.bound.max_len, "maxLength")):
        if value is not None:
            schema[json_key] = value
    if optional:
        schema = {"oneOf": [schema, {"type": "null"}]}
    entry: dict[str, Any] = {"name": f.wire, "required": f.required, "schema": schema}
    if f.doc:
        entry["description"] = f.doc
    return entry


def _json_schema(tp: Any) -> dict[str, Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return {"enum": list(args)}
    if origin is tuple:  # tuple[X, ...]: a JSON array of X
        return {"type": "array", "items": _json_schema(args[0]), "uniqueItems": True}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:
        return {"type": "string"}
    return {}


def result_schema(tp: Any) -> dict[str, Any]:
    """The JSON schema of a result type: TypedDicts become objects with ``properties`` and
    ``required`` (``NotRequired`` keys and ``total=False`` ones left out of it), nested ones
    inline; lists, string-keyed dicts, unions, ``None``, literals and scalars as JSON has them."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if typing.is_typeddict(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        # __required_keys__ misses Required/NotRequired written as strings (postponed
        # annotations) on Python 3.11, so the wrappers in the resolved hints decide.
        required = set(tp.__required_keys__)
        properties: dict[str, Any] = {}
        for key, hint in hints.items():
            wrapper = typing.get_origin(hint)
            if wrapper is NotRequired:
                required.discard(key)
            elif wrapper is Required:
                required.add(key)
            properties[key] = result_schema(typing.get_args(hint)[0]
                                            if wrapper in (NotRequired, Required) else hint)
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            schema["required"] = [k for k in hints if k in required]
        return schema
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        options = [result_schema(a) for a in members]
        if len(members) < len(args):
            options.append({"type": "null"})
        return {"oneOf": options} if len(members) == 1 else {"anyOf": options}
    if tp is type(None):
        return {"type": "null"}
    if origin is list:
        return {"type": "array", "items": result_schema(args[0])}
    if origin is dict or tp is dict:
        value = args[1] if args else Any
        return ({"type": "object"} if value is Any
                else {"type": "object", "additionalProperties": result_schema(value)})
    return _json_schema(tp)


def parse_params(method: Method, params: Any) -> Any:
    """Validate wire params (a camelCase object, or absent) into ``method.params``."""
    if params is None:
        params = {}
    if isinstance(params, list):
        raise InvalidParams("params", "must be an object (by-name); arrays are not accepted")
    if not isinstance(params, dict):
        raise InvalidParams("params", "must be an object")
    fields, known = method.fields, method.accepted
    if not fields and not params:  # a dict by now: gateway.health and friends, nothing to check
        return method.params()
    for key in params:
        if key not in fields:
            raise InvalidParams(str(key), f"unknown parameter (accepted: {known})")
    kwargs: dict[str, Any] = {}
    for wire, f in fields.items():
        if wire not in params:
            if f.required:
                raise InvalidParams(wire, "is required")
            continue
        kwargs[f.name] = _check(wire, f.type, params[wire], f.bound)
    return method.params(**kwargs)


def _check(name: str, tp: Any, value: Any, bound: Bound) -> Any:
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
    if origin is tuple:  # tuple[X, ...] on the wire is a non-empty array of distinct X
        if not isinstance(value, list) or not value:
            raise InvalidParams(name, "must be a non-empty array")
        items = tuple(_check(name, args[0], item, Bound()) for item in value)
        if len(set(items)) != len(items):
            raise InvalidParams(name, "must not repeat an item")
        return items
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
        max_len = bound.max_len
        if max_len is not None and len(value) > max_len:
            raise InvalidParams(name, f"is too long ({len(value)} > {max_len} characters)")
    if isinstance(value, int | float) and not isinstance(value, bool):
        lo, hi = bound.min, bound.max
        if lo is not None and value < lo:
            raise InvalidParams(name, f"must be >= {lo}")
        if hi is not None and value > hi:
            raise InvalidParams(name, f"must be <= {hi}")
    return value
