"""The house's dependency rules, read from the code's own imports: server -> planner ->
engine; loadgen stays a client for any server, that neither imports pagode nor starts it;
nothing imports the benchmarks but the tests, which import only the measures they share with
them (a test runs a program as a program); nothing outside tests/ imports tests; inside
server/, each stage of a request imports only the stages below it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_packages(folder: str) -> dict[str, set[str]]:
    """Top-level package of every import, by file, for each .py file under `folder`."""
    return {str(path.relative_to(ROOT)): imported_packages_of(ast.parse(path.read_text(encoding="utf-8")))
            for path in sorted((ROOT / folder).rglob("*.py"))}


def test_nothing_imports_the_benchmarks() -> None:
    for folder in ("engine", "server", "loadgen", "planner", "cuda_kernels", "cpu_kernels"):
        offenders = [f for f, names in imported_packages(folder).items() if "benchmarks" in names]
        assert not offenders, f"{offenders} import benchmarks/"


# What the tests and the benchmarks both measure with: the kernels' torch oracle and the quality
# gates' teacher-forced reading. The tests import these and no benchmark program.
SHARED_WITH_TESTS = {"benchmarks.kernel_reference", "benchmarks.teacher_forcing"}


def benchmark_modules_imported(tree: ast.AST) -> set[str]:
    """`from benchmarks.kernel_reference import x` -> "benchmarks.kernel_reference"."""
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            used |= {alias.name for alias in node.names if alias.name.split(".")[0] == "benchmarks"}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "benchmarks":
                used |= {f"benchmarks.{alias.name}" for alias in node.names}
            elif node.module.startswith("benchmarks."):
                used.add(node.module)
    return used


def test_the_tests_import_only_what_they_share_with_the_benchmarks() -> None:
    offenders = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        extra = benchmark_modules_imported(ast.parse(path.read_text(encoding="utf-8"))) - SHARED_WITH_TESTS
        if extra:
            offenders[str(path.relative_to(ROOT))] = extra
    assert not offenders, f"{offenders}: tests run the benchmarks as programs"


def test_nothing_outside_tests_imports_tests() -> None:
    """tests/ is the tests' own: what a benchmark measures with beside them lives in benchmarks/,
    and a wheel ships no tests/. Function-local imports count, and so does a module of tests/
    imported by its bare name, as the tests import each other."""
    of_tests = {"tests"} | {path.stem for path in (ROOT / "tests").glob("*.py")}
    for folder in ("benchmarks", "engine", "server", "planner", "loadgen", "cpu_kernels", "cuda_kernels"):
        offenders = {f: names & of_tests for f, names in imported_packages(folder).items() if names & of_tests}
        assert not offenders, f"{offenders} import tests/"


def test_loadgen_imports_neither_the_engine_nor_the_server() -> None:
    offenders = {f: names & {"engine", "server", "planner"}
                 for f, names in imported_packages("loadgen").items()
                 if names & {"engine", "server", "planner"}}
    assert not offenders


def test_loadgen_starts_no_pagode() -> None:
    """What only pagode needs (its serve command, the drivers that measure it) is in benchmarks/."""
    offenders = [str(path.relative_to(ROOT)) for path in sorted((ROOT / "loadgen").rglob("*.py"))
                 if "server.cli" in path.read_text(encoding="utf-8")]
    assert not offenders


def test_the_engine_imports_nothing_above_it() -> None:
    above = {"server", "planner", "loadgen", "benchmarks"}
    for folder in ("engine", "cuda_kernels"):
        offenders = {f: names & above for f, names in imported_packages(folder).items() if names & above}
        assert not offenders


def test_the_kernel_packages_import_no_other_part_of_pagode() -> None:
    """cpu_kernels and cuda_kernels sit below the engine: it hands them what they need."""
    ours = {"engine", "server", "planner", "loadgen", "benchmarks"}
    for folder in ("cpu_kernels", "cuda_kernels"):
        offenders = {f: names & ours for f, names in imported_packages(folder).items() if names & ours}
        assert not offenders


# Inside server/: one folder per stage of a request, each importing only the stages below it.
# A part is a folder of server/ or a module at its top; an import of `server.X...` uses part X.
SERVER_PARTS_ALLOWED: dict[str, set[str]] = {
    "settings": set(),  # the options, read from their own metadata
    "worker_pool": set(),  # the threads that CPU-bound request work runs in
    "api": {"settings", "worker_pool"},  # the floor: OpenAI models, errors, body parsing
    "middleware": {"api"},
    "translate": {"api"},  # pure functions: a body and the engine's facts -> engine requests
    "runtime": {"api", "settings"},  # the engine, admission, running choices, metrics, drain
    "respond": {"api", "runtime"},  # deltas -> response bodies and SSE
    "routes": {"api", "translate", "runtime", "respond", "worker_pool"},  # the stages composed
    "ui": {"api"},  # the web page: static files and the routes that serve them
    "app": {"api", "middleware", "routes", "runtime", "settings", "translate", "ui"},
    "hub_command": set(),  # `pagode pull`
    "serve_models": {"runtime"},  # which models `pagode serve` serves, hub names fetched first
    "cli": {"app", "hub_command", "middleware", "runtime", "serve_models", "settings"},
    "__main__": {"cli"},
    # Ray Serve's deployments: each replica builds the whole app, as `pagode serve` does.
    "fleet": {"api", "app", "cli", "middleware", "serve_models", "settings"},
}


def server_part(path: str) -> str:
    """`server/api/body.py` -> "api"; `server/app.py` -> "app"."""
    parts = Path(path).relative_to("server").parts
    return parts[0] if len(parts) > 1 else Path(parts[0]).stem


def server_parts_imported(path: Path) -> set[str]:
    used: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            used |= {alias.name.split(".")[1] for alias in node.names
                     if alias.name.startswith("server.")}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "server":
                used |= {alias.name for alias in node.names}
            elif node.module.startswith("server."):
                used.add(node.module.split(".")[1])
    return used


def test_each_server_stage_imports_only_the_stages_below_it() -> None:
    offenders: dict[str, set[str]] = {}
    for path in sorted((ROOT / "server").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        part = server_part(rel)
        if part == "__init__":
            continue
        assert part in SERVER_PARTS_ALLOWED, f"{rel}: a new part of server/ needs its rule here"
        extra = server_parts_imported(path) - SERVER_PARTS_ALLOWED[part] - {part}
        if extra:
            offenders[rel] = extra
    assert not offenders, offenders


def test_production_code_reads_nothing_under_tests() -> None:
    """A wheel ships no tests/: no path into it (a string naming the folder, outside
    docstrings) and no import of it in engine/, server/ or planner/."""
    offenders = []
    for folder in ("engine", "server", "planner"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = {n.value for n in ast.walk(tree)
                     if isinstance(n, ast.Constant) and isinstance(n.value, str)} - docstrings(tree)
            hits = sorted(s for s in names if TESTS_PATH.search(s))
            if hits or "tests" in imported_packages_of(tree):
                offenders.append(f"{path.relative_to(ROOT)}: {hits or 'import tests'}")
    assert not offenders


TESTS_PATH = re.compile(r"(^|[/\\])tests([/\\]|$)")


def docstrings(tree: ast.AST) -> set[str]:
    """The docstrings of a module and of its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.add(doc)
    return found


def imported_packages_of(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def engine_part(path: Path) -> str:
    """`engine/core/scheduler.py` -> "core"; `engine/config.py` -> "config"."""
    parts = path.relative_to(ROOT / "engine").parts
    return parts[0] if len(parts) > 1 else Path(parts[0]).stem


def engine_parts_imported(tree: ast.AST, parts: set[str]) -> set[str]:
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            used |= {alias.name.split(".")[1] for alias in node.names if alias.name.startswith("engine.")}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module == "engine":
                used |= {alias.name for alias in node.names}
            elif node.module.startswith("engine."):
                used.add(node.module.split(".")[1])
    return used & parts


def engine_part_imports() -> dict[str, set[str]]:
    """Which parts of engine/ (a folder, or a module at its top) each part imports, function-local
    imports included, the package's own __init__ (its public names) left out."""
    files = [p for p in sorted((ROOT / "engine").rglob("*.py")) if p != ROOT / "engine" / "__init__.py"]
    parts = {engine_part(p) for p in files}
    graph: dict[str, set[str]] = {part: set() for part in parts}
    for path in files:
        part = engine_part(path)
        graph[part] |= engine_parts_imported(ast.parse(path.read_text(encoding="utf-8")), parts) - {part}
    return graph


def a_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph as the parts along it, or [] where there is none."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := walk(node)):
            return found
    return []


def test_the_engines_parts_import_each_other_one_way() -> None:
    """Inside engine/, imports between its folders and top modules form no cycle, so each part
    can be read knowing only the parts below it (a cycle here is how a package's modules came
    to reach back up through function-local imports)."""
    assert a_cycle(engine_part_imports()) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert a_cycle({"a": {"b"}, "b": set()}) == []


def test_the_fleet_reads_the_engine_only_through_its_public_interface() -> None:
    """server/fleet/ routes by the engine's block hashes and answers with its client: the block
    manager, the model loader and the runner stay the engine's own."""
    private = ("engine.core", "engine.model", "engine.runner")
    offenders = {}
    for path in sorted((ROOT / "server" / "fleet").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
            bad = [n for n in names if any(n == p or n.startswith(p + ".") for p in private)]
            if bad:
                offenders[str(path.relative_to(ROOT))] = bad
    assert not offenders
