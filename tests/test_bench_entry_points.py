"""``python -m benchmarks``: the table of entry points matches the modules, and the dispatcher
lists, refuses unknown names and runs ``main(argv)`` under its own command name."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import __main__ as dispatcher
from benchmarks.common import GROUPS, ROOT

HELPERS = {"methods/bench_run.py", "methods/bench_report.py", "gpu/configs.py",
           "gpu/control.py", "gpu/kernel.py", "gpu/measure.py", "gpu/report.py",
           "gpu/rounds.py", "gpu/weights.py"}


def _module_files() -> set[str]:
    bench = ROOT / "benchmarks"
    return {str(p.relative_to(bench)) for p in bench.glob("*/*.py") if p.name != "__init__.py"}


def test_every_benchmark_module_is_an_entry_point_or_a_named_helper():
    listed = {f"{g}/{n}.py" for g, (_, names) in GROUPS.items() for n in names}
    assert listed | HELPERS == _module_files()
    assert not listed & HELPERS


@pytest.mark.parametrize("path", sorted(_module_files()))
def test_modules_have_main_and_no_script_guard(path):
    """Entry points define ``main(argv=None)``; no module runs as a script of its own."""
    tree = ast.parse((ROOT / "benchmarks" / path).read_text())
    mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    if path not in HELPERS:
        assert len(mains) == 1 and [a.arg for a in mains[0].args.args] == ["argv"]
        assert mains[0].args.defaults and mains[0].args.defaults[0].value is None
    assert not [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n)]


def test_listing_and_unknown_names(capsys):
    assert dispatcher.main([]) == 0
    out = capsys.readouterr().out
    assert all(g in out for g in GROUPS) and "python -m benchmarks GROUP NAME" in out
    assert dispatcher.main(["methods"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in GROUPS["methods"][1])
    assert dispatcher.main(["nope"]) == 2 and "unknown group" in capsys.readouterr().err
    assert dispatcher.main(["methods", "nope"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err


def test_runs_main_with_the_command_as_prog(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))   # the dispatcher rewrites it
    with pytest.raises(SystemExit) as e:
        dispatcher.main(["methods", "bf16-host", "--help"])   # dashes name the module too
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m benchmarks methods bf16_host")


def test_the_maintained_set_stays_small():
    """Issue 64: at most 10 entry points (``tables`` counts) and 3,000 lines of Python."""
    entry_points = sum(len(names) for _, names in GROUPS.values()) + 1
    lines = sum(len(p.read_text().splitlines()) for p in (ROOT / "benchmarks").rglob("*.py"))
    assert entry_points <= 10 and lines <= 3000, (entry_points, lines)


def test_tables_runs_through_the_dispatcher(capsys):
    assert dispatcher.main(["tables", "--check"]) == 0


def test_module_entry_point_from_the_repository_root():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "gpu"], capture_output=True,
                          text=True, timeout=120, cwd=Path(ROOT))
    assert proc.returncode == 0, proc.stderr
    assert "suite" in proc.stdout and "carry" in proc.stdout
