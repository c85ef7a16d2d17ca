"""The example notebooks, executed top to bottom in a real kernel (nbclient), outputs checked."""
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))
from run_notebook import execute  # noqa: E402

NOTEBOOKS = ROOT / "example_notebooks"


def _text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            parts.append(out["text"])
        elif "data" in out:
            parts.append(out["data"].get("text/plain", ""))
        elif out["output_type"] == "error":
            parts.append("\n".join(out["traceback"]))
    return "".join(parts)


def test_the_main_mnist_notebook(tmp_path):
    nb = execute(NOTEBOOKS / "mnist-tensorflow-keras.ipynb", tmp_path / "mnist.ipynb")
    texts = [_text(c) for c in nb.cells if c.cell_type == "code"]
    everything = "\n".join(texts)
    assert re.search(r"data: (MNIST|scikit-learn digits)", everything)
    single = next(t for t in texts if "Epoch 5/5" in t and "[0]" in t)
    assert re.search(r"Out|0\.\d+", single)
    distributed = next(t for t in texts if "rank 0 of 2: test accuracy" in t)
    assert "[0] Epoch 8/8" in distributed and "[1] Epoch" not in distributed
    accuracy = float(re.search(r"test accuracy after 8 epochs on 2 ranks: (\d\.\d+)", everything).group(1))
    assert accuracy >= 0.85
    assert "HorovodRun" in everything and "status      succeeded" in everything
    assert "predicted:" in everything
    assert "epoch timing" in everything and re.search(r"\n\s+8\s+\d+\.\d+", everything)
    # live widgets, saved in the notebook's widget state with their final values
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    bars = [m["state"] for m in state.values() if m["model_name"] == "IntProgressModel"]
    assert len(bars) == 3  # one rank for np=-1, two for np=2
    assert all(b["bar_style"] == "success" and b["value"] == b["max"] > 0 for b in bars)
    headers = [m["state"]["value"] for m in state.values()
               if m["model_name"] == "HTMLModel" and "Horovod job" in m["state"]["value"]]
    assert any("2 ranks on spark local[2]" in h and "done" in h for h in headers)
