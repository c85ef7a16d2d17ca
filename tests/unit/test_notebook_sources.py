"""The committed example notebooks are their only source: kept clean and valid Python.

(They are run end to end, outputs checked, by tests/notebooks/test_example_notebooks.py.)
"""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from IPython.core.inputtransformer2 import TransformerManager

NOTEBOOKS = sorted((Path(__file__).parents[2] / "example_notebooks").glob("*.ipynb"))


def _code_cells(path: Path) -> list[str]:
    nb = json.loads(path.read_text())
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in nb["cells"] if c["cell_type"] == "code"]


def test_there_are_example_notebooks():
    assert len(NOTEBOOKS) >= 8


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_is_committed_without_outputs(path):
    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4
    dirty = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_code_cell_and_every_horovod_cell_body_is_python(path):
    for source in _code_cells(path):
        if source.startswith("%%"):
            body = source.split("\n", 1)[1] if "\n" in source else ""
            ast.parse(body)  # a %%horovod cell runs as plain Python on the ranks
        else:
            ast.parse(TransformerManager().transform_cell(source))
