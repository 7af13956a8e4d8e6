"""The package's dependency graph stays visible and acyclic: no import cycle between sleuth modules
(function-level imports included: they are dependencies too), and in-package imports sit at module
top except where a comment on the line (or the line before) says why (``# lazy: ...``): mostly the
command modules, which import their work lazily so that ``sleuth --help`` does not load torch
(measured: 0.12 s against 2.6 s)."""

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "sleuth"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(module: str, path: Path, modules: dict[str, Path]):
    """``(target module, line number, inside a function)`` for every in-package import that runs."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node)
            for n in ast.walk(node)}
    in_function = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for n in ast.walk(fn)}
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            targets = [a.name for a in node.names]
        for target in targets:
            while target and target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in modules and target != module:
                yield target, node.lineno, id(node) in in_function


def _graph():
    modules = _modules()
    return modules, {m: list(_imports(m, p, modules)) for m, p in modules.items()}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_inside_the_package():
    _, graph = _graph()
    edges = {m: {t for t, _, _ in imports} for m, imports in graph.items()}
    assert _cycles(edges) == []


def test_the_cycle_finder_can_fail():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_in_package_imports_are_at_module_top_or_say_why():
    modules, graph = _graph()
    lazy = []
    for module, imports in graph.items():
        lines = modules[module].read_text(encoding="utf-8").splitlines()
        for _, lineno, inside in imports:
            said = "# lazy:" in lines[lineno - 1] or (lineno > 1 and "# lazy:" in lines[lineno - 2])
            if inside and not said:
                lazy.append(f"{modules[module].relative_to(PACKAGE.parent)}:{lineno}: {lines[lineno - 1].strip()}")
    assert lazy == [], "move these imports to module top, or say why they are lazy (# lazy: ...):\n" + "\n".join(lazy)


# Layers, lowest first: a module imports only its own layer and the ones below (data flows one way; the
# embedded toy world and the demo sit above everything they are built from, and the core reaches the
# names they provide through sleuth.named). Command modules (``*.cli``, ``sleuth.cli``) and the package
# root are on top.
LAYERS = [
    {"sleuth.version", "sleuth.errors", "sleuth.types", "sleuth.device", "sleuth.config", "sleuth.config_file",
     "sleuth.records", "sleuth.output", "sleuth.named", "sleuth.run_layout", "sleuth.files", "sleuth.gguf_cache"},
    {"sleuth.algo", "sleuth.retrieval", "sleuth.reward", "sleuth.models"},
    {"sleuth.rollout", "sleuth.data"},
    {"sleuth.build", "sleuth.eval"},
    {"sleuth.train"},
    {"sleuth.sft", "sleuth.view"},
    {"sleuth.toy"},
    {"sleuth.demo"},
]


def _layer(module: str) -> int:
    if module in ("sleuth", "sleuth.__main__", "sleuth.cli") or module.endswith(".cli") or module.endswith("_cli"):
        return len(LAYERS)
    for i, names in enumerate(LAYERS):
        if any(module == n or module.startswith(n + ".") for n in names):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def _upward(graph) -> list[str]:
    return sorted(f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)}), line {line}"
                  for m, imports in graph.items() for t, line, _ in imports if _layer(t) > _layer(m))


def test_no_module_imports_a_higher_layer():
    _, graph = _graph()
    assert _upward(graph) == []


def test_the_core_never_imports_the_toy_world_or_the_demo():
    _, graph = _graph()
    core = [m for m in graph if _layer(m) < _layer("sleuth.toy")]
    bad = [f"{m} -> {t}" for m in core for t, _, _ in graph[m] if t.startswith(("sleuth.toy", "sleuth.demo"))]
    assert bad == []


def test_the_layer_check_can_fail():
    graph = {"sleuth.models": [("sleuth.train.checkpoint", 22, False)], "sleuth.train.loop": [("sleuth.models", 1, False)]}
    assert _upward(graph) == ["sleuth.models (layer 1) imports sleuth.train.checkpoint (layer 4), line 22"]


def test_the_tiny_name_without_the_toy_registered_is_a_clear_error():
    import subprocess
    import sys

    code = ("import sleuth.models as m\ntry:\n    m.load_policy('tiny')\nexcept RuntimeError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300).stdout
    assert "model 'tiny' is registered by sleuth.toy: import it first" in out
