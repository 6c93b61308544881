"""The library apart from the lab: no module of ``dominotree_jax`` or ``convert`` imports
``experiments`` or ``benchmarks``, and every one of them imports without matplotlib and tqdm
(extras only reports and progress bars ask for, imported where they are used)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("dominotree_jax", "convert")
LAB = {"experiments", "benchmarks"}
EXTRAS = ("matplotlib", "tqdm")


def library_modules() -> dict[str, Path]:
    out = {}
    for pkg in LIBRARY:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__main__":
                continue
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imported_names(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    names = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            names |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            names.add(n.module)
    return names


def test_the_library_never_imports_the_lab():
    mods = library_modules()
    assert len(mods) > 50 and "dominotree_jax.train.data.collect" in mods
    bad = {m: sorted(t for t in imported_names(p) if t.split(".")[0] in LAB)
           for m, p in mods.items()}
    assert not {m: t for m, t in bad.items() if t}


def test_extras_are_never_imported_at_a_modules_top_level():
    bad = {m: sorted(t for t in imported_names(p, top_level_only=True)
                     if t.split(".")[0] in EXTRAS) for m, p in library_modules().items()}
    assert not {m: t for m, t in bad.items() if t}


def test_every_library_module_imports_without_the_extras():
    """In a fresh interpreter where importing matplotlib or tqdm fails."""
    mods = sorted(library_modules())
    code = ("import sys, importlib\n"
            + "".join(f"sys.modules[{x!r}] = None\n" for x in EXTRAS)
            + f"for m in {mods!r}:\n    importlib.import_module(m)\n"
            + "print('imported', len(sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("imported")


def module_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the library modules it imports anywhere in its code: at its top level, inside
    functions and under ``TYPE_CHECKING`` (``from pkg import name`` counts ``pkg`` and, where it
    is a module, ``pkg.name``). A cycle through a function-level or annotation-only import is
    still two modules that cannot be read apart."""
    graph = {}
    for m, p in mods.items():
        names = set()
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.Import):
                names |= {a.name for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
                names |= {n.module} | {f"{n.module}.{a.name}" for a in n.names}
        graph[m] = {x for x in names if x in mods and x != m}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on.discard(comp[-1])
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = module_graph(library_modules())
    assert "dominotree_jax.decoding.round" in graph["dominotree_jax.decoding.decode"]
    assert "dominotree_jax.decoding.loop_inputs" in graph["dominotree_jax.decoding.draft"]
    assert import_cycles(graph) == []
