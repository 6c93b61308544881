"""The docs' measured tables equal what ``python -m benchmarks tables`` renders from the results
files (benchmarks/tables.py), so a table cannot drift from its data."""

from __future__ import annotations

import json
import shutil

import pytest

from benchmarks import tables
from benchmarks.common import RESULTS, ROOT


def test_committed_docs_equal_the_rendered_tables():
    assert tables.stale_tables() == [], "run: python -m benchmarks tables"


def test_every_table_names_its_command_machine_and_date():
    for name, (_, kind, rels) in tables.TABLES.items():
        text = tables.render(name)
        for rel in rels:
            data = json.loads((RESULTS / rel).read_text())
            date = data["date"] if kind == "host" else data["machine"]["date"]
            assert data["command"] in text and date in text, (name, rel)
        assert "\n| " in text and "×" in text


@pytest.fixture
def copy_of_repo(tmp_path, monkeypatch):
    """The docs and results files the tables read, copied under ``tmp_path``."""
    docs = {doc for doc, _, _ in tables.TABLES.values()}
    for doc in docs:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)
    for _, _, rels in tables.TABLES.values():
        for rel in rels:
            (tmp_path / "results" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(RESULTS / rel, tmp_path / "results" / rel)
    monkeypatch.setattr(tables, "ROOT", tmp_path)
    monkeypatch.setattr(tables, "RESULTS", tmp_path / "results")
    return tmp_path


def test_a_changed_result_is_caught_and_rewritten(copy_of_repo, capsys):
    path = copy_of_repo / "results" / "lookup" / "bench.json"
    data = json.loads(path.read_text())
    data["cells"][1]["tok_s"] = 12345.6
    path.write_text(json.dumps(data))
    assert tables.stale_tables() == ["lookup"]
    assert tables.main(["--check"]) == 1 and "lookup" in capsys.readouterr().err
    assert tables.main([]) == 0
    assert tables.stale_tables() == []
    assert "12345.6" in (copy_of_repo / "docs" / "results.md").read_text()


def test_a_doc_without_its_markers_is_refused_by_name(copy_of_repo):
    readme = copy_of_repo / "README.md"
    readme.write_text(readme.read_text().replace("<!-- table:readme -->", ""))
    with pytest.raises(ValueError, match="README.md has no <!-- table:readme -->"):
        tables.stale_tables()
