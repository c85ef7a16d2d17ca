"""The README's Quick start, executed as written in a fresh kernel (nbclient), so the front door
cannot drift from the product.

The only lines added are what a user brings: imports, data (scikit-learn's digits as arrays and
as DataFrames of the session the first cell starts), the functions the README calls by name
(``train``, ``train_ddp``, ``build_model``), a pool cell that reads a DataFrame (the text's
claim), and the checks at the end. ``modelDir`` points into the test's folder instead of /tmp.
"""
import re

import nbformat

from tests.conftest import ROOT
from tests.notebooks.test_example_notebooks import _text, execute

_PRELUDE = '''\
import numpy as np
from sklearn.datasets import load_digits

digits = load_digits()
x, y = (digits.data / 16).astype("float32"), digits.target
x_train, y_train, x_test, y_test = x[:1500], y[:1500], x[1500:], y[1500:]

def build_model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))

def train(learning_rate):
    import horovod.torch as hvd
    import torch
    hvd.init()
    model = build_model()
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=learning_rate),
                                         named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    features, labels = torch.from_numpy(x_train), torch.from_numpy(y_train)
    for _ in range(30):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(features), labels)
        loss.backward()
        optimizer.step()
    return float(loss)

def train_ddp(learning_rate):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(build_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x_train)),
                                             torch.from_numpy(y_train))
    loss.backward()
    optimizer.step()
    return model
'''
_DATA = '''\
from pyspark.sql import SparkSession
spark = SparkSession.getActiveSession()   # the embedded session the first cell started
rows = [(x[i].tolist(), int(y[i])) for i in range(len(y))]
train_df = spark.createDataFrame(rows[:1500], "pixels array<float>, label int")
test_df = spark.createDataFrame(rows[1500:], "pixels array<float>, label int")
'''
_POOL_READS = '''\
%%horovod
seen = sum(len(labels) for _, labels in train_df.to_torch("pixels", "label", batch_size=64))
seen
'''
_CHECKS = '''\
print("accuracy", accuracy)
print("value", value)
print("model", type(model).__module__, type(model).__name__)
print("predictions", predictions.count())
'''


def quick_start_blocks() -> list[str]:
    """The README's Quick start code blocks, in order."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Quick start"):text.index("\n## ", text.index("## Quick start"))]
    return [block.strip() + "\n" for block in re.findall(r"```python\n(.*?)```", section, re.S)]


def test_the_readmes_quick_start_runs_as_written(tmp_path):
    blocks = quick_start_blocks()
    assert len(blocks) >= 12, blocks
    cells = [_PRELUDE]
    for block in blocks:
        if "train_df" in block and not any("train_df = " in c for c in cells):
            cells.append(_DATA)
        cells.append(block.replace('"/tmp/mnist-model"', repr(str(tmp_path / "mnist-model"))))
        if block.startswith("%%horovod\n"):  # the pool's cell: one that reads a DataFrame too
            cells.append(_POOL_READS)
    cells.append(_CHECKS)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    path = tmp_path / "readme.ipynb"
    nbformat.write(nb, path)
    done = execute(path, tmp_path / "executed.ipynb")  # raises on the first failing cell
    texts = {cell.source: _text(cell) for cell in done.cells}
    everything = "\n".join(texts.values())
    assert re.search(r"started an embedded local\[\d+\] one", everything)
    assert float(re.search(r"accuracy (\d\.\d+)", everything).group(1)) > 0.5
    assert re.search(r"value \d+\.\d+", everything)
    # TorchDistributor's DDP model came back as the model it wraps
    assert "model torch.nn.modules.container Sequential" in everything
    assert "predictions 297" in everything
    pool_cell = texts[_POOL_READS]
    assert "dealt 'train_df' to the pool's 2 ranks: 1,500 rows" in pool_cell, pool_cell
    stacks = next(t for s, t in texts.items() if s.startswith("%hvd_stacks job"))
    # both ranks named: each on its line, or together where they are in the same place
    assert re.search(r"ranks 0, 1\b|rank 0\b[\s\S]*rank 1\b", stacks), stacks
    assert "Traceback" not in everything
