"""Our wheel, installed as a user installs it: built with ``pip wheel``, put into a fresh venv
with only the frameworks a user chose (PyTorch, pyspark, ipykernel), no editable install and no
repository on the path; the README's Quick start cells on ``--engine torch``, ``HorovodRunner``
and ``TorchDistributor``, and a DataFrame shard, run in a kernel of that venv. Its default
engine, without Horovod there, fails with the command that builds it.

Before: ``%load_ext hvd_magics`` failed there (numpy undeclared), then every Spark job (pandas
and pyarrow undeclared).
"""
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.conftest import ROOT
from tests.notebooks.test_example_notebooks import _text
from tests.notebooks.test_readme import quick_start_blocks

sys.path.insert(0, str(ROOT / "scripts"))
from run_notebook import execute  # noqa: E402

#: What a user brings: PyTorch (the CPU build on this machine's disk) and pyspark.
FRAMEWORKS = ["torch==2.13.0", "pyspark==4.3.0", "ipykernel"]

_PRELUDE = '''\
import numpy as np
import hvd_magics
print("hvd_magics from", hvd_magics.__file__)
x_train = np.random.default_rng(0).random((512, 8), dtype=np.float32)
y_train = (x_train.sum(1) > 4).astype("int64")

def build_model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))

def train(learning_rate):
    import torch
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    for _ in range(5):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x_train)),
                                                 torch.from_numpy(y_train))
        loss.backward()
        optimizer.step()
    return float(loss)

def train_ddp(learning_rate):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(build_model())
    torch.optim.SGD(model.parameters(), lr=learning_rate).step()
    return model
'''
_SHARD = '''\
from pyspark.sql import SparkSession
spark = SparkSession.getActiveSession()
train_df = spark.createDataFrame([(x.tolist(), int(y)) for x, y in zip(x_train, y_train)],
                                 "pixels array<float>, label int")
'''
_SHARD_CELL = '''\
%%horovod np=2 --engine torch --return seen
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rows = torch.tensor(sum(len(labels) for _, labels in train_df.to_torch("pixels", "label",
                                                                       batch_size=64)))
dist.all_reduce(rows)
seen = int(rows)
'''
_HOROVOD_CELL = '''\
%%horovod np=2
import horovod.torch as hvd
hvd.init()
'''
_CHECKS = 'print("value", value)\nprint("model", type(model).__name__)\nprint("seen", seen)\n'


def _block(start: str) -> str:
    return next(block for block in quick_start_blocks() if block.startswith(start))


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv with the frameworks and our wheel (pip's cache makes it take seconds)."""
    folder = tmp_path_factory.mktemp("fresh")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(folder / "dist"), str(ROOT)], check=True, capture_output=True)
    wheel = next((folder / "dist").glob("hvd_magics-*.whl"))
    subprocess.run([sys._base_executable, "-m", "venv", str(folder / "venv")], check=True)
    python = folder / "venv" / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", *FRAMEWORKS, str(wheel)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def _kernel_spec(python: Path, folder: Path) -> Path:
    spec = folder / "kernels" / "fresh-venv"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fresh venv", "language": "python"}))
    return folder


def test_the_wheel_runs_the_quick_start_in_a_fresh_venv(venv, tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_PATH", str(_kernel_spec(venv, tmp_path / "jupyter")))
    monkeypatch.delenv("PYTHONPATH", raising=False)
    cells = ["%load_ext hvd_magics", _PRELUDE, _block("%%horovod np=2 --engine torch"),
             _block("from hvd_magics import HorovodRunner"),
             _block("from hvd_magics import TorchDistributor"), _SHARD, _SHARD_CELL, _CHECKS,
             _HOROVOD_CELL]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbformat.write(nb, tmp_path / "fresh.ipynb")
    work = tmp_path / "work"
    work.mkdir()
    done = execute(tmp_path / "fresh.ipynb", tmp_path / "executed.ipynb", cwd=work,
                   kernel="fresh-venv", allow_errors=True)
    texts = [_text(cell) for cell in done.cells]
    for source, text in zip(cells[:-1], texts[:-1]):
        assert "Error" not in text, f"{source}\n---\n{text}"
    everything = "\n".join(texts)
    assert f"hvd_magics from {venv.parents[1]}" in everything  # the wheel, not the repository
    assert "started an embedded local" in everything
    assert "model Sequential" in everything  # TorchDistributor's DDP model came back unwrapped
    assert "seen 512" in everything  # the two ranks' shards together: every row, once
    failed = texts[-1]
    assert "No module named 'horovod'" in failed, failed
    assert "python -m hvd_magics.horovod build" in failed and "--engine torch" in failed, failed
    assert 'pip install "hvd_magics[horovod]"' in failed, failed  # pyyaml and cmake come with it
