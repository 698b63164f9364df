"""The import arrows of docs/architecture.md, checked on the source so a new import that
breaks them fails here rather than in a reviewer's head."""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LEAVES = {"gateway.errors", "gateway.config", "gateway.wire", "gateway.auth", "gateway.logs",
          "gateway.client", "gateway.private", "gateway.runtime", "gateway.storage",
          "gateway.origins", "gateway.sections", "gateway.readiness", "gateway.importing"}
# Rooms of gateway/ and what each may import besides the leaves, sessions and memory.
ALLOWED = {
    "gateway.rpc": set(),
    "gateway.transport": {"gateway.rpc", "gateway.web"},  # it serves the web client's files
    "gateway.web": set(),
    "gateway.chat": {"gateway.rpc"},
    "gateway.methods": {"gateway.rpc", "gateway.chat"},
    "gateway.cli": {"gateway.app", "gateway.mcp"},
    # An MCP server whose tools are clients of the daemon (gateway/client.py); its listener's
    # sockets count in the transport's one descriptor budget (transport/guard.py), and its
    # per-user body bytes in a quota bucket of rpc/ (rpc/quota.py's ByteRate).
    "gateway.mcp": {"gateway.transport", "gateway.rpc"},
    "gateway.retention": set(),
    "gateway.cluster": {"gateway.chat"},  # its hub is the chat hub that also reaches other nodes
    "gateway.opening": {"gateway.cluster"},  # the store, memory and cluster node [storage] picks
    "gateway.app": {"gateway.rpc", "gateway.transport", "gateway.chat", "gateway.methods",
                    "gateway.retention", "gateway.mcp", "gateway.cluster", "gateway.opening"},
}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] != "gateway" or len(parts) == 1 else f"gateway.{parts[1]}"


def _imports(package: str) -> dict[str, set[str]]:
    """Room -> modules it imports (full dotted names)."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        names = found.setdefault(_room(module), set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
    return found


@pytest.mark.parametrize("room", sorted(ALLOWED))
def test_gateway_rooms_import_only_what_architecture_allows(room: str) -> None:
    """Each room of gateway/ imports only the rooms docs/architecture.md lets it."""
    ours = {_room(m) for m in _imports("gateway")[room] if m.startswith("gateway.")} - {room}
    assert ours <= ALLOWED[room] | LEAVES, sorted(ours - ALLOWED[room] - LEAVES)


def test_gateway_reaches_sessions_and_memory_only_through_their_top_level() -> None:
    """gateway/ imports `sessions` and `memory`, never their inner modules (those may move)."""
    inner = sorted(m for names in _imports("gateway").values() for m in names
                   if m.startswith(("sessions.", "memory.")))
    assert inner == []


@pytest.mark.parametrize("package", ["sessions", "memory", "testkit", "bench"])
def test_libraries_and_bench_never_import_what_stands_on_them(package: str) -> None:
    """sessions/ and memory/ never import gateway/ (nor each other's code); testkit/ imports none
    of its users; bench/ never imports tests/ or research/."""
    names = {m for ms in _imports(package).values() for m in ms}
    banned = {"sessions": ("gateway", "memory"), "memory": ("gateway",),
              "testkit": ("tests", "bench", "research"), "bench": ("tests", "research")}[package]
    assert not {m for m in names if m.split(".")[0] in banned}


def test_tests_import_bench_only_from_tests_bench() -> None:
    """The tests stand on testkit/ and the packages; only tests/bench/, which tests the
    benchmarks, imports bench/, and no test imports research/."""
    found = []
    for path in (ROOT / "tests").rglob("*.py"):
        inside_bench = path.relative_to(ROOT / "tests").parts[0] == "bench"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module]
                     if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            top = {n.split(".")[0] for n in names}
            if "research" in top or ("bench" in top and not inside_bench):
                found.append(f"{path.relative_to(ROOT)}: {', '.join(sorted(names))}")
    assert found == []


FIRST_PARTY = ("gateway", "sessions", "memory", "testkit", "bench", "research", "tests")


def test_memory_imports_only_the_top_level_of_sessions() -> None:
    """Of the project's packages, memory/ imports only `sessions` itself, never an inner
    module of it (docs/architecture.md: the one arrow is memory → sessions top level)."""
    outside = {m for ms in _imports("memory").values() for m in ms
               if m.split(".")[0] in FIRST_PARTY and m.split(".")[0] != "memory"}
    assert outside <= {"sessions"}, sorted(outside - {"sessions"})


def _sessions_pg_tables() -> set[str]:
    """The tables the sessions store creates on PostgreSQL, read off its migrations."""
    schema = (ROOT / "sessions" / "pg" / "schema.py").read_text(encoding="utf-8")
    return set(re.findall(r"CREATE TABLE (?:IF NOT EXISTS )?(\w+)", schema))


def test_only_sessions_names_its_postgres_tables() -> None:
    """sessions/ owns its PostgreSQL schema: no module of gateway, memory, testkit, bench or
    research names one of its tables (nor the change channel, named after one); they read them
    through ``sessions.pg_feed`` (or load them through ``sessions.pg.bulk``)."""
    tables = _sessions_pg_tables()
    assert {"recalld_sessions", "recalld_messages"} <= tables
    found = sorted(f"{path.relative_to(ROOT)}: {name}"
                   for package in ("gateway", "memory", "testkit", "bench", "research")
                   for path in (ROOT / package).rglob("*.py")
                   for name in sorted(tables) if name in path.read_text(encoding="utf-8"))
    assert found == []


def _module_imports(module: str) -> set[str]:
    """What one module imports: full dotted names, relative imports resolved, and for
    ``from package import name`` both the package and ``package.name`` (it may be a module)."""
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    package = module.rsplit(".", 1)[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            source = ".".join(p for p in (base, node.module or "") if p)
            names.add(source)
            names.update(f"{source}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_memory_db_and_migrations_do_not_import_each_other() -> None:
    """memory/sqlite/index/db.py and migrations.py are not an import loop: db runs the migrations,
    and the migrations never reach back into db."""
    db, migrations = "memory.sqlite.index.db", "memory.sqlite.index.migrations"
    assert migrations in _module_imports(db)
    assert db not in _module_imports(migrations)



def _runtime_imports(path: Path, module: str, modules: set[str]) -> set[str]:
    """The first-party modules ``path`` runs when it is loaded: top-level statements only (an
    import inside a function or under ``if TYPE_CHECKING`` runs later or never). ``from pkg
    import sub`` of a submodule is an edge to ``pkg.sub`` alone."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            subs = {f"{base}.{a.name}" for a in node.names} & modules
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(base)
    return (found & modules) - {module}


def test_no_import_loops_in_the_packages() -> None:
    """No module of gateway, sessions or memory imports, when it is loaded, a module that
    imports it back, directly or through others: each package reads bottom-up."""
    paths: dict[str, Path] = {}
    for package in ("gateway", "sessions", "memory"):
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            paths[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    graph = {name: _runtime_imports(path, name, set(paths)) for name, path in paths.items()}
    loops: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    trail: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        trail.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                loops.append([*trail[trail.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        trail.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    assert loops == []


# Past this many lines a module is named in a warning (STYLE: modules cut by responsibility).
LONG_MODULE = 600


def test_a_module_over_600_lines_is_reported() -> None:
    """Modules are cut by responsibility, not by a line count: one past ~600 lines is named in a
    warning (a prompt to look for a second responsibility in it), never a failure."""
    long = {str(p.relative_to(ROOT)): n for package in ("gateway", "sessions", "memory")
            for p in (ROOT / package).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > LONG_MODULE}
    for path, n in sorted(long.items()):
        warnings.warn(f"{path} has {n} lines: does it hold more than one responsibility?",
                      stacklevel=1)


# The storage drivers: a module that imports one of these is an implementation of a backend.
DRIVERS = {"apsw", "sqlite_vec", "psycopg", "psycopg_pool"}
# The seams the gateway depends on; they name value types only, never a backend's module.
NEUTRAL_SEAMS = ("memory.protocols", "sessions.protocol", "memory.context")


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _dependencies(path: Path, module: str, modules: dict[str, Path]) -> tuple[set[str], set[str]]:
    """The first-party modules ``module`` imports and the drivers it imports, at any depth of its
    body (a function's import runs when it is called) but under ``if TYPE_CHECKING``. A name taken
    from a package's ``__init__`` is followed to the module that ``__init__`` has it from, so a
    facade that gathers both backends (memory/, sessions/) does not count against a module that
    takes one neutral value through it; ``import package`` takes the whole facade."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    first_party: set[str] = set()
    drivers: set[str] = set()

    def walk(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if _is_type_checking(node):
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    (drivers if alias.name.split(".")[0] in DRIVERS
                     else first_party).add(alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                if base.split(".")[0] in DRIVERS:
                    drivers.add(base)
                for alias in node.names:
                    first_party.add(_defining_module(base, alias.name, modules))
            walk([child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)])

    walk(ast.parse(path.read_text(encoding="utf-8")).body)
    return (first_party & set(modules)) - {module}, drivers


def _defining_module(base: str, name: str, modules: dict[str, Path]) -> str:
    """Where ``from base import name`` gets ``name``: the submodule ``base.name``, or, for a name a
    package's ``__init__`` imports from one of its modules, that module (followed on), else
    ``base``."""
    if f"{base}.{name}" in modules:
        return f"{base}.{name}"
    path = modules.get(base)
    if path is None or path.name != "__init__.py":
        return base
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            if any((alias.asname or alias.name) == name for alias in node.names):
                return _defining_module(f"{base}.{node.module}", name, modules)
    return base


def test_the_seams_import_no_storage_driver_directly_or_through_others() -> None:
    """memory/protocols.py, sessions/protocol.py and memory/context.py reach no module that imports
    apsw, sqlite-vec or psycopg, directly or through the modules of gateway, sessions and memory
    they import: the Protocols stand on value types, and a backend plugs in beneath them."""
    modules: dict[str, Path] = {}
    for package in ("gateway", "sessions", "memory"):
        for path in (ROOT / package).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            modules[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    graph = {name: _dependencies(path, name, modules) for name, path in modules.items()}
    found: list[str] = []
    for seam in NEUTRAL_SEAMS:
        trail = {seam: [seam]}
        todo = [seam]
        while todo:
            node = todo.pop()
            imports, drivers = graph[node]
            if drivers:
                found.append(f"{' -> '.join(trail[node])} imports {', '.join(sorted(drivers))}")
            for nxt in sorted(imports - trail.keys()):
                trail[nxt] = [*trail[node], nxt]
                todo.append(nxt)
    assert found == []


# The composition root stays flat (issue 30): a part receives its settings as one value, and
# each part started in gateway/app.py has a function of its own.
MAX_SERVER_PARAMETERS = 8
MAX_APP_FUNCTION_LINES = 60


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [node for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]


def _gateway_server_init() -> ast.FunctionDef:
    tree = ast.parse((ROOT / "gateway" / "transport" / "server.py").read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GatewayServer"]
    (init,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    return init


def test_gateway_server_takes_its_settings_not_unrolled_fields() -> None:
    """``GatewayServer.__init__`` takes at most 8 parameters besides ``self``: its limits come as
    one settings value, not one keyword per config field."""
    args = _gateway_server_init().args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    assert names[0] == "self"
    assert len(names) - 1 <= MAX_SERVER_PARAMETERS, names[1:]


def test_no_function_of_the_composition_root_is_over_60_lines() -> None:
    """No function or method of gateway/app.py spans more than 60 lines (decorators and
    docstring included): each part it starts is a small function of its own."""
    spans = {f"{f.name}:{f.lineno}": (f.end_lineno or f.lineno) - first + 1
             for f in _functions(ROOT / "gateway" / "app.py")
             for first in [min([f.lineno, *(d.lineno for d in f.decorator_list)])]}
    assert spans  # the file was read
    assert {name: n for name, n in spans.items() if n > MAX_APP_FUNCTION_LINES} == {}


# Each backend of memory is one folder (issue 30): its driver is named nowhere else in memory/.
_BACKEND_DRIVERS = {"memory/sqlite": ("apsw", "sqlite_vec"),
                    "memory/pg": ("psycopg", "psycopg_pool")}


def test_memory_names_a_storage_driver_only_in_its_backends_folder() -> None:
    """apsw and sqlite-vec are imported only under memory/sqlite/, psycopg only under memory/pg/:
    memory's rules (retrieval, facts, episodes, context) are written once over
    memory.steps.Steps and the Protocols, and a third backend is one more folder."""
    stray: list[str] = []
    for path in sorted((ROOT / "memory").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        own = next((drivers for folder, drivers in _BACKEND_DRIVERS.items()
                    if rel.startswith(folder + "/")), ())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                     and node.level == 0 else [])
            for name in names:
                top = name.split(".")[0]
                foreign = {d for ds in _BACKEND_DRIVERS.values() for d in ds} - set(own)
                if top in foreign:
                    stray.append(f"{rel}: {name}")
    assert stray == []
