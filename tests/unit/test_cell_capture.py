"""Capturing a cell: what it reads from the notebook, IPython syntax, tracebacks with cell lines."""
import os
import traceback

import pytest

from hvd_magics.errors import CellError
from hvd_magics.notebook.cell_capture import capture, free_names
from hvd_magics.rank.cell_runner import CELL_FILENAME, run_captured_cell


def test_free_names_skip_what_the_cell_binds_first():
    src = "import numpy as np\nx = 1\ny = x + scale\nspark = make()\nprint(spark, np, data)\n"
    assert free_names(src) == ["scale", "make", "print", "data"]


def test_capture_ships_values_and_reimports_modules():
    def helper(v):
        return v * 2

    ns = {"os": os, "helper": helper, "factor": 3, "unused": object(), "In": []}
    cell = capture("result = helper(factor)\nos.getpid()\nIn\n", ns).cell
    assert cell.modules == {"os": "os"}
    assert set(cell.values) == {"helper", "factor"}


def test_ipython_syntax_is_refused_with_its_line():
    with pytest.raises(CellError, match=r"line 3 uses IPython syntax \('!ls'\)"):
        capture("x = 1\n!ls\n", {})
    with pytest.raises(CellError, match="line 2 uses IPython syntax"):
        capture("%timeit x\n", {})
    with pytest.raises(CellError, match=r"line 4 uses IPython syntax \('!ls'\)"):
        capture("\n  \n!ls\n", {})


def test_a_cell_that_starts_with_blank_lines_is_plain_python():
    # a blank line after %%horovod is common; IPython drops it, which is not IPython syntax
    assert capture("\n\nx = 1\nx + 1\n", {}).cell.source.strip() == "x = 1\nx + 1"


def test_syntax_error_names_the_cell_line():
    with pytest.raises(CellError, match="line 3"):
        capture("x = 1\ny = (\n", {})


def test_the_cell_runs_and_returns_its_last_expression_and_asked_names():
    cell = capture("a = base + 1\nb = a * 2\nb + 1\n", {"base": 1}, return_names=("a", "b")).cell
    out = run_captured_cell(cell)
    assert out == {"value": 5, "return:a": 2, "return:b": 4}


def test_a_statement_last_gives_none_and_missing_return_names_are_an_error():
    assert run_captured_cell(capture("x = 1\n", {}).cell)["value"] is None
    with pytest.raises(NameError, match="--return names z"):
        run_captured_cell(capture("x = 1\n", {}, return_names=("z",)).cell)


def test_tracebacks_point_at_cell_lines_and_show_the_source():
    cell = capture("x = 1\ndef f():\n    raise KeyError('nope')\nf()\n", {},
                   header="%%horovod np=2").cell
    with pytest.raises(KeyError) as info:
        run_captured_cell(cell)
    text = "".join(traceback.format_exception(info.value))
    assert f'File "{CELL_FILENAME}", line 5' in text and "f()" in text
    assert f'File "{CELL_FILENAME}", line 4' in text and "raise KeyError('nope')" in text


def test_only_the_leading_imports_are_imported_early():
    from hvd_magics.launch.payload import leading_imports

    cell = ("import tensorflow as tf\nimport horovod.tensorflow.keras as hvd\n"
            "from sklearn.datasets import load_digits\nhvd.init()\nimport torch\n")
    assert leading_imports(cell) == ["tensorflow", "horovod.tensorflow.keras", "sklearn.datasets"]
    # an import after code may depend on that code (a backend chosen through the environment)
    assert leading_imports("import os\nos.environ['KERAS_BACKEND'] = 'torch'\nimport keras\n") \
        == ["os"]
    function = ('    def main(a):\n        """Doc."""\n        import horovod.torch as hvd, torch\n'
                '        from . import local\n        hvd.init()\n')
    assert leading_imports(function) == ["horovod.torch", "torch"]
    assert leading_imports("def broken(:\n") == []


def test_one_parse_gives_the_values_the_unbound_returns_and_the_early_imports():
    plan = capture("import os\nimport json\nx = base\n", {"base": 2}, return_names=("x", "y"))
    assert plan.cell.values == {"base": 2}
    assert plan.unbound_returns == ["y"]
    assert plan.preimport == ("os", "json")
