"""``dominotree_jax/train/`` as data -> run -> eval: three entry points, every command a module's
``main(argv)`` behind a dispatcher, no import of a ``__main__`` and no import cycle (in the
whole package; checked in tests/test_library_boundary.py)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from dominotree_jax.train.cli import DATA_COMMANDS, EVAL_COMMANDS, dispatch

PACKAGE = Path(__file__).resolve().parent.parent / "dominotree_jax"
TRAIN = PACKAGE / "train"
ENTRY_POINTS = {"__main__.py", "data/__main__.py", "eval/__main__.py"}


def _modules(root: Path = TRAIN) -> dict[str, Path]:
    out = {}
    for p in root.rglob("*.py"):
        parts = ("dominotree_jax",) + p.relative_to(PACKAGE).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _has_script_guard(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.If) and "__main__" in ast.unparse(n.test) for n in tree.body)


def test_three_entry_points():
    guarded = {str(p.relative_to(TRAIN)) for p in TRAIN.rglob("*.py") if _has_script_guard(p)}
    assert guarded == ENTRY_POINTS


@pytest.mark.parametrize("module", sorted(m for m, _ in {**DATA_COMMANDS,
                                                         **EVAL_COMMANDS}.values()))
def test_every_command_is_a_main_of_argv(module):
    tree = ast.parse(_modules()[module].read_text())
    mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    assert len(mains) == 1 and [a.arg for a in mains[0].args.args] == ["argv"]


def _imports(root: Path = TRAIN) -> dict[str, set[str]]:
    """Module -> the package modules it imports (at any depth of its code)."""
    mods = _modules(root)
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
                names = [n.module] + [f"{n.module}.{a.name}" for a in n.names]
            else:
                continue
            graph[m] |= {t for t in names if t in mods and t != m}
    return graph


def test_no_import_of_a_main_and_data_imports_neither_run_nor_eval():
    """(No import cycle anywhere in the package: tests/test_library_boundary.py.)"""
    graph = _imports(PACKAGE)
    assert not [(m, t) for m, ts in graph.items() for t in ts if t.endswith("__main__")]
    # data -> run -> eval: data imports neither the run nor eval
    data = {m for m in graph if m.split(".")[:3] == ["dominotree_jax", "train", "data"]}
    graph = {m: {t for t in ts if t.startswith("dominotree_jax.train")} for m, ts in graph.items()}
    assert "dominotree_jax.train.dataset" not in data and len(data) >= 9
    for m in data:
        assert not graph[m] - data - {"dominotree_jax.train.cli"}, m


def test_dispatcher_lists_refuses_and_runs_under_its_command_name(capsys):
    prog = "python -m dominotree_jax.train.eval"
    assert dispatch(prog, EVAL_COMMANDS, []) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in EVAL_COMMANDS) and out.startswith(f"usage: {prog}")
    assert dispatch(prog, EVAL_COMMANDS, ["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        dispatch(prog, EVAL_COMMANDS, ["acceptance", "--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {prog} acceptance")


def test_data_commands_default_to_collect(capsys):
    prog = "python -m dominotree_jax.train.data"
    with pytest.raises(SystemExit) as e:          # no command: collect's own options
        dispatch(prog, DATA_COMMANDS, ["--data", "d", "--help"], default="collect")
    assert e.value.code == 0 and "--refill" in capsys.readouterr().out
    assert dispatch(prog, DATA_COMMANDS, ["backfill-topk"], default="collect") == 2  # the lab's
    assert "unknown command 'backfill-topk'" in capsys.readouterr().err
    assert dispatch(prog, DATA_COMMANDS, ["--help"], default="collect") == 0
    assert "without a COMMAND: collect" in capsys.readouterr().out
    collect = importlib.import_module(DATA_COMMANDS["collect"][0])
    assert collect.parse_args(["--data", "d", "--refill", "32"]).refill == 32
    with pytest.raises(SystemExit):
        collect.parse_args(["--data", "d", "--segment", "32"])   # the re-prefilling engine is gone
