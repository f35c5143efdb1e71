"""The package's import graph: every module imports, no two modules import each other, directly or through
others, and no module imports one of a layer above its own (data flows one way: formats -> arithmetic -> kernels ->
plan -> API -> CLI; :data:`LAYERS`, drawn in docs/architecture.md).

The graph is read statically from every ``import`` statement of every module, at module level or inside a
function (a deferred import is still a dependency); the implicit import of a submodule's parent package is not an
edge. A cycle is a strongly connected set of more than one module.
"""

from __future__ import annotations

import ast
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mmaemu"


def module_files():
    """{dotted name: (path, is_package)} of every module of the package."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        modules[".".join(parts)] = (path, is_package)
    return modules


def _absolute(module, is_package, level, name):
    """The dotted target of a relative import ``from <level dots><name> import ...`` written in ``module``."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def import_graph(modules):
    """{module: set of package modules it imports}; ``from x import y`` counts as an import of x.y when x.y is a
    module, else of x."""
    graph = {}
    for module, (path, is_package) in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, is_package, node.level, node.module) if node.level else (node.module or "")
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in modules else base)
        graph[module] = {t for t in targets if t in modules and t != module}
    return graph


def cycles(graph):
    """Strongly connected sets of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


# The layers, lowest first: (name, modules and packages). A module belongs to the layer of its longest listed
# prefix (the package itself, "mmaemu", is no prefix: a new top-level module must be given a layer here); it may
# import its own layer and those below, never one above.
LAYERS = (
    ("base", ("mmaemu._version", "mmaemu.base", "mmaemu.errors", "mmaemu.environment", "mmaemu.warn",
              "mmaemu.context", "mmaemu.scale_layout",
              "mmaemu.formats")),
    ("arithmetic", ("mmaemu.arith",)),
    ("presets", ("mmaemu.model.presets", "mmaemu.model.chunked")),
    ("kernels", ("mmaemu.cpu", "mmaemu.cuda", "mmaemu.model")),
    ("plan", ("mmaemu.plan", "mmaemu.platform", "mmaemu.backends", "mmaemu.quantize", "mmaemu.block_quantize",
              "mmaemu.delayed_scaling")),
    # A recipe (mmaemu.recipes) is made of the plan's rules and steps and the kernels, and computes; the block-wise
    # recipe's GEMM is mmaemu.blockwise_cublaslt's. Validation, the planner and its cache find the call's recipe
    # and ask it: they sit on top of the recipes.
    ("recipes", ("mmaemu.recipes", "mmaemu.blockwise_cublaslt")),
    ("planner", ("mmaemu.plan.validate", "mmaemu.plan.planner", "mmaemu.plan.cache")),
    ("api", ("mmaemu.api", "mmaemu.deepgemm", "mmaemu.audit", "mmaemu.scaled_v2", "mmaemu.grouped",
             "mmaemu.torch_ops")),
    ("edge", ("mmaemu", "mmaemu.cli", "mmaemu.nn", "mmaemu.nn_recipes", "mmaemu.nn_training", "mmaemu.audit_training",
              "mmaemu.patching", "mmaemu.cli.diagnostics", "mmaemu.record", "mmaemu.testing", "mmaemu.demo",
              "mmaemu.__main__")),
)


def layer_of(module):
    """(index, name) of the layer of a module: that of its longest prefix in LAYERS; None if it has none."""
    best = None
    for index, (name, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module == prefix or (prefix != "mmaemu" and module.startswith(prefix + "."))
            if inside and (best is None or len(prefix) > best[2]):
                best = (index, name, len(prefix))
    return None if best is None else best[:2]


def upward_imports(graph):
    """["importer [layer] -> imported [layer]"] of the imports that reach a higher layer."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            low, high = layer_of(module), layer_of(target)
            if low is not None and high is not None and high[0] > low[0]:
                found.append(f"{module} [{low[1]}] -> {target} [{high[1]}]")
    return found


def test_every_module_has_a_layer():
    assert [m for m in module_files() if layer_of(m) is None] == []


def test_no_module_imports_a_higher_layer():
    found = upward_imports(import_graph(module_files()))
    assert not found, "imports that reach up the layers: " + "; ".join(found)


def test_the_layer_check_finds_a_planted_upward_import():
    graph = {"mmaemu.arith.block": {"mmaemu.formats"}, "mmaemu.formats": {"mmaemu.api"}, "mmaemu.api": set()}
    assert upward_imports(graph) == ["mmaemu.formats [base] -> mmaemu.api [api]"]
    assert layer_of("mmaemu.model.presets") == (2, "presets") and layer_of("mmaemu.model.dot") == (3, "kernels")


def test_no_import_cycles():
    found = cycles(import_graph(module_files()))
    assert not found, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in found)


def test_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_deferred_and_relative_imports():
    graph = import_graph(module_files())
    # backends reaches the CUDA package only inside functions; the kernels import the launch-free shim.
    assert "mmaemu.cuda" in graph["mmaemu.backends"]
    assert "mmaemu.cuda.shim" in graph["mmaemu.cuda.simple.kernels"]


def test_the_cuda_package_layers_by_kind():
    """mmaemu.cuda's kernels (native, offset, simple, blockwise, block_scaled) import neither the dispatch nor the verdicts; its
    metadata, device facts and shim import no kernel; offline PTX/SASS tooling is not in the package."""
    graph = import_graph(module_files())
    kernels = {m for m in graph if m.split(".")[2:3] in (["native"], ["offset"], ["simple"], ["blockwise"],
                                                         ["block_scaled"])}
    assert {"mmaemu.cuda.native.kernel", "mmaemu.cuda.offset.kernel", "mmaemu.cuda.simple.kernels",
            "mmaemu.cuda.blockwise.kernel", "mmaemu.cuda.block_scaled.kernel"} <= kernels
    upward = {m: sorted(t for t in graph[m] if t.startswith(("mmaemu.cuda.dispatch", "mmaemu.cuda.verdicts")))
              for m in kernels}
    assert not {m: t for m, t in upward.items() if t}, upward
    for base in ("mmaemu.cuda.catalog", "mmaemu.cuda.device", "mmaemu.cuda.shim"):
        assert not {t for t in graph[base] if t.startswith("mmaemu.cuda.") and t != "mmaemu.cuda.shim"}, base
    assert not [m for m in graph if m.endswith((".offline", ".sass"))]


@pytest.mark.subprocess
def test_every_module_imports():
    """Each module imports in a fresh interpreter (CUDA kernel modules need numba.cuda, never a GPU)."""
    names = sorted(n for n in module_files() if not n.endswith("__main__"))
    code = ("import importlib, json, sys\nbad = {}\nfor name in json.loads(sys.argv[1]):\n"
            "    try:\n        importlib.import_module(name)\n"
            "    except Exception as exc:\n        bad[name] = f'{type(exc).__name__}: {exc}'\nprint(json.dumps(bad))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(names)], capture_output=True, text=True, env=env,
                         cwd=str(ROOT), timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}
