"""The package's layers (docs/architecture.md), checked from the source.

* No import cycles among pipecore's modules, counting imports inside
  functions too.
* Imports only go down the layers: kernels < core < schedules < analysis <
  output < scan < search < bindings < the top modules (the package
  ``__init__``, cli and its subcommands in commands/, testing, warm).
* Every Numba-compiled function lives under pipecore/kernels/, and the
  kernels import nothing of pipecore's but other kernels.
* The public names are the ones committed in tests/public_api.txt (written
  from the tree before the layout change).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "pipecore"

LAYERS = ["kernels", "core", "schedules", "analysis", "output", "scan", "search", "plan"]
TOP = {"pipecore", "pipecore.cli", "pipecore.testing", "pipecore.warm"}
TOP_PACKAGES = ("pipecore.commands",)  # cli's subcommands, one module per group
NUMBA_DECORATORS = {"njit", "jit", "vectorize", "guvectorize", "stencil", "cfunc", "generated_jit",
                    "intrinsic", "overload"}


def _modules():
    """Module name -> (path, is_package) for pipecore and its bindings."""
    mods = {}
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        mods[".".join(parts)] = (path, is_pkg)
    for path in sorted((ROOT / "bindings").glob("*.py")):
        name = "pipecore.bindings" if path.stem == "__init__" else f"pipecore.bindings.{path.stem}"
        mods[name] = (path, path.stem == "__init__")
    return mods


MODULES = _modules()


def _imports(name):
    """Every pipecore module `name` imports, wherever the import statement is."""
    path, is_pkg = MODULES[name]
    tree = ast.parse(path.read_text(), str(path))
    package = name if is_pkg else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import sub` imports the submodule sub when there is one.
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in MODULES else mod for a in node.names]
        else:
            continue
        found += [(t, node.lineno) for t in targets if t == "pipecore" or t.startswith("pipecore.")]
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def _top(name):
    return name in TOP or any(name == p or name.startswith(p + ".") for p in TOP_PACKAGES)


def _layer(name):
    if _top(name):
        return len(LAYERS) + 1
    if name.startswith("pipecore.bindings"):
        return len(LAYERS)
    return LAYERS.index(name.split(".")[1])


def test_every_module_sits_in_a_layer():
    for name in MODULES:
        if not _top(name) and not name.startswith("pipecore.bindings"):
            assert name.split(".")[1] in LAYERS, f"{name} is in no layer folder"


def test_imports_name_real_modules():
    # The former flat paths (pipecore.costs, ...) are aliases for users, not for the package.
    for name, targets in GRAPH.items():
        for target, line in targets:
            assert target in MODULES, f"{name}:{line} imports {target}, which is no module file"


def _cycles(graph):
    """Strongly connected components of 2+ modules (Tarjan): each holds a cycle."""
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w, _ in graph[v]:
            if w == v or w not in graph:
                continue
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
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def _upward(graph):
    """Imports from a lower layer into a higher one; `pipecore` itself is the top."""
    return [f"{name}:{line} -> {target}" for name, targets in graph.items()
            for target, line in targets
            if (target in MODULES and _layer(target) > _layer(name))
            or (target == "pipecore" and name != "pipecore" and _layer(name) <= len(LAYERS))]


def test_no_import_cycles():
    assert not _cycles(GRAPH), f"import cycles: {_cycles(GRAPH)}"


def test_imports_go_down_the_layers():
    bad = _upward(GRAPH)
    assert not bad, "imports that go up the layers:\n" + "\n".join(bad)


def test_checkers_catch_what_they_are_for():
    # The three former cycles, and a lazy import back up, as the checkers see them.
    fake = {"pipecore.core.pack": [("pipecore.core.simulate", 1)],
            "pipecore.core.simulate": [("pipecore.analysis.variation", 2)],
            "pipecore.analysis.variation": [("pipecore.core.pack", 3)],
            "pipecore.scan.scans": [("pipecore.scan.ray", 4)],
            "pipecore.scan.ray": [("pipecore.scan.scans", 5)]}
    assert sorted(_cycles(fake)) == [
        ["pipecore.analysis.variation", "pipecore.core.pack", "pipecore.core.simulate"],
        ["pipecore.scan.ray", "pipecore.scan.scans"]]
    assert _upward(fake) == ["pipecore.core.simulate:2 -> pipecore.analysis.variation"]
    # A lazy import inside a function counts: tune imports local_search only inside
    # a function, and the walk sees it.
    assert any(t == "pipecore.search.local" for t, _ in GRAPH["pipecore.search.tune"])


def _numba_uses(path):
    tree = ast.parse(path.read_text(), str(path))
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                if name in NUMBA_DECORATORS:
                    hits.append((node.name, node.lineno))
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) \
                    and f.value.id == "numba" and f.attr in NUMBA_DECORATORS:
                hits.append(("numba." + f.attr, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module == "numba":
            hits += [(a.name, node.lineno) for a in node.names if a.name in NUMBA_DECORATORS]
    return hits


def test_numba_code_lives_in_kernels():
    outside = [f"{path.relative_to(ROOT)}:{line} {what}"
               for name, (path, _) in MODULES.items() if not name.startswith("pipecore.kernels")
               for what, line in _numba_uses(path)]
    assert not outside, "Numba-compiled code outside pipecore/kernels/:\n" + "\n".join(outside)
    inside = [name for name, (path, _) in MODULES.items()
              if name.startswith("pipecore.kernels.") and _numba_uses(path)]
    assert len(inside) >= 5, inside  # the checker sees the kernels it should


def _is_named_tuple(node):
    return any(isinstance(b, ast.Name) and b.id == "NamedTuple" for b in node.bases)


def _overloaded(tree):
    # A plain function named in @overload(f) is the interpreted face of a compiled one.
    return {d.args[0].id for node in tree.body if isinstance(node, ast.FunctionDef)
            for d in node.decorator_list
            if isinstance(d, ast.Call) and getattr(d.func, "id", "") == "overload"
            and d.args and isinstance(d.args[0], ast.Name)}


def test_kernels_hold_only_compiled_functions_and_plain_imports():
    for name, (path, is_pkg) in MODULES.items():
        if not name.startswith("pipecore.kernels"):
            continue
        for target, line in GRAPH[name]:
            assert target.startswith("pipecore.kernels"), f"{name}:{line} imports {target}"
        tree = ast.parse(path.read_text())
        compiled = {n for n, _ in _numba_uses(path)} | _overloaded(tree)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                assert node.name in compiled, f"{name}.{node.name} is not Numba-compiled"
            # Named carriers (NamedTuples of the kernels' arrays) are the one kind of class.
            assert not isinstance(node, ast.ClassDef) or _is_named_tuple(node), \
                f"{name} defines class {node.name}"
        if is_pkg:
            assert not compiled


def _public_names():
    import pipecore

    lines = [f"pipecore {n}" for n in sorted(pipecore.__all__)]
    for mod in ("pipecore.blocks", "pipecore.generate", "pipecore.milp", "pipecore.search",
                "pipecore.adaptive", "pipecore.testing", "pipecore.bindings.torch",
                "pipecore.orders", "pipecore.placements",
                # The issue-54 families' helpers users call by module (costs per chunk, studies).
                "pipecore.schedules.seq1f1b", "pipecore.schedules.helixpipe", "pipecore.schedules.vocab",
                "pipecore.schedules.asynchronous", "pipecore.analysis.longseq", "pipecore.plan.vocab"):
        m = importlib.import_module(mod)
        lines += [f"{mod} {n}" for n in sorted(m.__all__)]
    return lines


def test_public_names_unchanged():
    committed = [line for line in (ROOT / "tests" / "public_api.txt").read_text().splitlines()
                 if line and not line.startswith("#")]
    now = _public_names()
    assert sorted(set(committed) - set(now)) == [], "public names gone"
    assert now == committed


def test_public_names_resolve():
    import pipecore as pc

    for line in _public_names():
        mod, name = line.split()
        assert getattr(importlib.import_module(mod), name) is not None, line
    # pc.blocks and friends are attributes of the package as well as importable paths.
    for attr in ("blocks", "generate", "milp", "search", "adaptive", "orders", "placements"):
        assert getattr(pc, attr) is importlib.import_module(f"pipecore.{attr}")


@pytest.mark.parametrize("former", ["costs", "simulate", "batch", "scans", "formulas", "table",
                                    "compare", "study", "critical", "variation", "model", "tune",
                                    "partition", "recompute", "offload", "output", "schedules"])
def test_former_module_paths_still_import(former):
    # Code written against the flat tree (`from pipecore.study import study`) keeps working.
    mod = importlib.import_module(f"pipecore.{former}")
    assert mod.__name__.startswith("pipecore.")


def test_openmp_threads_sleep_while_they_wait_unless_the_user_chose():
    # Spinning OpenMP threads stall parallel kernels on a busy machine (pytest
    # -n, torch ranks): pipecore makes them sleep, unless OMP_WAIT_POLICY is set.
    import os
    import subprocess
    import sys

    code = "import os, pipecore; print(os.environ['OMP_WAIT_POLICY'])"
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert got == "PASSIVE"
    env["OMP_WAIT_POLICY"] = "ACTIVE"
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip()
    assert got == "ACTIVE"
