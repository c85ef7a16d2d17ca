"""The example notebooks' parameters cells (papermill's convention: one cell tagged
``parameters``), and the injection that runs them smaller in tests/notebooks
(scripts/run_notebook.py's ``inject_parameters``)."""
from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from run_notebook import inject_parameters, parameter_names  # noqa: E402

NOTEBOOKS = sorted((ROOT / "example_notebooks").glob("*.ipynb"))
#: the notebooks that train nothing, so have no sizes to give
UNTRAINED = {"failures.ipynb"}
#: an epoch count written as a number in a cell: it belongs in the parameters cell
EPOCHS_LITERAL = re.compile(r"\b(epochs|max_epochs|num_train_epochs)\s*=\s*\d|setEpochs\(\d")


def _cells(path: Path) -> list[tuple[str, list[str]]]:
    """Each code cell's source and tags."""
    nb = json.loads(path.read_text())
    return [("".join(c["source"]), c.get("metadata", {}).get("tags", []))
            for c in nb["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name not in UNTRAINED],
                         ids=lambda p: p.name)
def test_a_notebook_that_trains_takes_its_sizes_from_one_parameters_cell(path):
    cells = _cells(path)
    tagged = [i for i, (_, tags) in enumerate(cells) if "parameters" in tags]
    assert len(tagged) == 1, f"{path.name}: {len(tagged)} cells tagged 'parameters'"
    source = cells[tagged[0]][0]
    for node in ast.parse(source).body:  # plain values, one name each
        assert isinstance(node, ast.Assign) and len(node.targets) == 1, ast.dump(node)
        ast.literal_eval(node.value)
    later = "\n".join(s for s, _ in cells[tagged[0] + 1:])
    for name in parameter_names(source):
        assert re.search(rf"\b{name}\b", later), f"{path.name}: {name} is read by no cell"
    others = [s for i, (s, _) in enumerate(cells) if i != tagged[0]]
    assert not [s for s in others if EPOCHS_LITERAL.search(s)], path.name


def _notebook(*sources: str, tags: tuple[str, ...] = ("parameters",)) -> Any:
    import nbformat  # here: a second to import, for the tests that use it

    cells = [nbformat.v4.new_code_cell(s) for s in sources]
    cells[1].metadata["tags"] = list(tags)
    return nbformat.v4.new_notebook(cells=cells)


def test_the_values_given_are_assigned_right_after_the_parameters_cell():
    nb = _notebook("%load_ext hvd_magics", "EPOCHS = 8  # full\nBATCH_SIZE = 32", "print(EPOCHS)")
    inject_parameters(nb, {"EPOCHS": 2})
    assert [c.source for c in nb.cells] == ["%load_ext hvd_magics",
                                            "EPOCHS = 8  # full\nBATCH_SIZE = 32",
                                            "# Parameters\nEPOCHS = 2\n", "print(EPOCHS)"]
    assert nb.cells[2].metadata["tags"] == ["injected-parameters"]
    import nbformat

    nbformat.validate(nb)


def test_a_name_the_parameters_cell_does_not_assign_is_refused():
    nb = _notebook("x = 1", "EPOCHS = 8", "print(EPOCHS)")
    with pytest.raises(ValueError, match=r"not assigned in the parameters cell: EPOCH$"):
        inject_parameters(nb, {"EPOCH": 2})


def test_a_notebook_without_one_parameters_cell_is_refused():
    nb = _notebook("x = 1", "EPOCHS = 8", "print(EPOCHS)", tags=())
    with pytest.raises(ValueError, match="0 cells are tagged 'parameters'"):
        inject_parameters(nb, {"EPOCHS": 2})
