"""The example notebooks, executed top to bottom in a real kernel (nbclient), outputs checked.

Each runs as papermill runs a notebook: the values given here replace those of its cell tagged
``parameters`` (fewer epochs, steps or rows than ``make main`` trains with), and the checks read
those values back from what the cells printed.
"""
import re
import sys
from pathlib import Path


from hvd_magics.job.readings.noise import is_noise
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


def _run(name: str, tmp_path: Path, **parameters):
    """Execute example notebook ``name`` with ``parameters`` in place of its parameters cell's
    values; return it, its code cells' texts, and all text joined."""
    nb = execute(NOTEBOOKS / name, tmp_path / name, cwd=tmp_path, parameters=parameters)
    texts = [_text(c) for c in nb.cells if c.cell_type == "code"]
    return nb, texts, "\n".join(texts)


def test_the_main_mnist_notebook(tmp_path):
    one, two = 3, 4  # epochs of the single-machine run and of the run on 2 ranks
    nb, texts, everything = _run("mnist-tensorflow-keras.ipynb", tmp_path,
                                 EPOCHS_ONE_PROCESS=one, EPOCHS=two)
    assert re.search(r"data: (MNIST|scikit-learn digits)", everything)
    single = next(t for t in texts if f"Epoch {one}/{one}" in t and "[0]" in t)
    assert f"[0] Epoch {one}/{one}" in single
    cell = next(c for c in nb.cells if c.source.startswith("%%horovod np=-1"))
    value = next(o for o in cell.outputs if o["output_type"] == "execute_result")
    assert 0.8 <= float(value["data"]["text/plain"]) <= 1.0  # the test accuracy, rank 0's value
    distributed = next(t for t in texts if "rank 0 of 2: test accuracy" in t)
    assert f"[0] Epoch {two}/{two}" in distributed and "[1] Epoch" not in distributed
    accuracy = float(re.search(rf"test accuracy after {two} epochs on 2 ranks: (\d\.\d+)",
                               everything).group(1))
    assert accuracy >= 0.85
    assert "HorovodRun" in everything and re.search(r"status +succeeded", everything)
    assert "predicted:" in everything
    assert "epoch timing" in everything and re.search(rf"\n\s+{two}\s+\d+\.\d+", everything)
    # live widgets, saved in the notebook's widget state with their final values
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    bars = [m["state"] for m in state.values() if m["model_name"] == "IntProgressModel"]
    assert len(bars) == 3  # one rank for np=-1, two for np=2
    assert all(b["bar_style"] == "success" and b["value"] == b["max"] > 0 for b in bars)
    headers = [m["state"]["value"] for m in state.values()
               if m["model_name"] == "HTMLModel" and "Horovod job" in m["state"]["value"]]
    # the embedded session: the cores and one slot to spare (a pool of them deals DataFrames)
    assert any(re.search(r"2 ranks on spark local\[[3-9]\]", h) and "done" in h
               for h in headers), headers
    # what matters only: no framework start-up chatter from the ranks, no JVM/log4j lines
    chatter = [line for line in everything.splitlines()
               if is_noise(re.sub(r"^\[\d+(@\S+)?\] ", "", line))]
    assert chatter == []
    assert "log4j" not in everything and "NativeCodeLoader" not in everything
    assert "WARN Utils" not in everything and "absl" not in everything


def _widget_models(nb, name):
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    return [m["state"] for m in state.values() if m["model_name"] == name]


def test_committed_notebooks_carry_no_outputs():
    import nbformat

    for path in NOTEBOOKS.glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), path.name


def test_the_pytorch_notebook(tmp_path):
    nb, texts, everything = _run("pytorch.ipynb", tmp_path, EPOCHS=3)
    accuracy = float(re.search(r"test accuracy on 2 ranks: (\d\.\d+)", everything).group(1))
    assert accuracy >= 0.85
    assert "[0] Epoch 3/3" in everything and "epoch timing" in everything
    bars = _widget_models(nb, "IntProgressModel")
    assert len(bars) == 3 and all(b["bar_style"] == "success" for b in bars)
    # the progress API reported 3 epochs of steps: the bars ended full at the step count
    assert sorted(b["max"] for b in bars)[-2:] == [22, 22]  # ceil(1347 / 2 ranks / 32 per batch)


def test_the_timeline_notebook(tmp_path):
    nb, texts, everything = _run("timeline.ipynb", tmp_path, STEPS=5)
    assert "40% lower Inception3 throughput" in everything
    assert "trace on the driver: hvd_timelines/timeline-" in everything
    show = next(c for c in nb.cells if c.source.startswith("%hvd_timeline show"))
    html = show.outputs[0]["data"]["text/html"]
    assert "ALLREDUCE" in html and "<svg" in html and "Perfetto" in html
    assert "Horovod Timeline is off" in everything


def test_the_failures_notebook(tmp_path):
    nb, texts, everything = _run("failures.ipynb", tmp_path)
    assert "the first was rank 1 on 127.0.0.1: ValueError: shard 1 is empty" in everything
    assert 'File "<%%horovod cell>", line 6, in load_shard' in everything
    assert re.search(r"status +failed", everything)
    assert "exited with code 3 without a Python exception" in everything
    assert "The notebook's own process holds a GPU (TensorFlow holds" in everything
    assert "np=0 runs nothing" in everything
    assert "Cannot ship the notebook variable 'lock' to the ranks: it is a lock" in everything
    assert "the kernel is still fine: 42" in everything
    assert "TaskKilled" not in everything and "Failed to cancel" not in everything


def test_the_scaling_benchmark_notebook(tmp_path):
    nb, texts, everything = _run("scaling-benchmark.ipynb", tmp_path, EPOCHS=2, REPEAT=1)
    table = next(t for t in texts if "images_per_s_wall" in t)
    rows = [line.split() for line in table[table.index(" np "):].strip().splitlines()[1:]]
    assert [row[0] for row in rows] == ["1", "2"]
    assert all(float(v) > 0 for row in rows for v in row[1:])
    assert float(rows[0][5]) == 1.0  # np=1 is the baseline of the efficiency
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def test_the_dataframes_notebook(tmp_path):
    nb, texts, everything = _run("dataframes.ipynb", tmp_path, EPOCHS=3)
    assert "4241 training rows, 759 validation rows" in everything
    # each rank printed its own shard: disjoint halves of the training rows
    assert "[0] <Shard of train_df: rank 0 of 2, 2,121 rows of 4,241; columns: pixels " \
           "list<element: float>, label int32>" in everything
    assert "[1] <Shard of train_df: rank 1 of 2, 2,120 rows of 4,241" in everything
    # the record's labels are padded to its longest (a rank's split: "steps of rank 0")
    assert re.search(r"data train_df +4,241 rows as 2,121 \+ 2,120 per rank", everything)
    assert "val_df rows per rank: [380, 379]" in everything
    keras = float(re.search(r"validation accuracy on 2 ranks: (\d\.\d+)", everything).group(1))
    torch = float(re.search(r"PyTorch validation accuracy on 2 ranks: (\d\.\d+)",
                            everything).group(1))
    assert keras >= 0.85 and torch >= 0.85, (keras, torch)  # 3 epochs: 0.9 or so
    assert "refused: column 'tags' of the DataFrame 'train' has type map<string,int>" in everything
    assert "Traceback" not in everything and "Py4J" not in everything


def test_the_estimator_notebook(tmp_path):
    nb, texts, everything = _run("estimator.ipynb", tmp_path, EPOCHS=1, MORE_EPOCHS=1)
    assert "HorovodModel(keras classifier, 1 epochs" in everything
    assert "resumed from {'epoch': 1, 'step': 0," in everything
    assert "epochs of this job: [2]" in everything
    accuracy = float(re.search(r"test accuracy: (\d\.\d+)", everything).group(1))
    assert accuracy >= 0.85, accuracy
    assert "model.keras" in everything and "outside Spark: [" in everything
    assert "loaded model gives the same predictions: True" in everything
    assert "refused: featuresCol 'pixels' is not a column of the DataFrame" in everything
    assert "Traceback" not in everything and "Py4J" not in everything


def test_the_elastic_notebook(tmp_path):
    nb, texts, everything = _run("elastic.ipynb", tmp_path, STEPS=80)
    assert re.search(r"elastic job started with 2 ranks \(task \d as rank 0, task \d as rank 1\)",
                     everything)
    assert re.search(r"reset 1: the rank of task \d exited with code -9; training goes on with 1 "
                     r"rank", everything)
    assert "'rank 0 of 1: 80 steps, largest weight error 0.0" in everything
    assert "elastic: 1:2 | exit codes:" in everything
    assert ("stopped: The elastic job failed: fewer than the minimum of 2 ranks (np=2:2) were left "
            "for longer than elastic_timeout=5 s (--elastic-timeout)") in everything
    # Horovod's own driver logs into the run's log file, not into the cell
    assert "ERROR:root" not in everything and "stop running" not in everything
    assert "Traceback" not in everything and "Py4J" not in everything
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    headers = [m["state"]["value"] for m in state.values()
               if m["model_name"] == "HTMLModel" and "Horovod job" in m["state"]["value"]]
    assert any("1 rank (elastic 1:2)" in h and "done" in h and "reset 1: the rank of task" in h
               for h in headers), headers
    assert any("(elastic 2:2)" in h and "failed" in h for h in headers), headers
    names = [m["state"]["value"] for m in state.values()
             if m["model_name"] == "HTMLModel" and m["state"]["value"].startswith("<b>task ")]
    assert any(re.match(r"<b>task \d = rank 0</b>", n) for n in names), names


def test_the_warm_pool_notebook(tmp_path):
    nb, texts, everything = _run("warm-pool.ipynb", tmp_path, MORE_EPOCHS=1)
    assert "2 warm ranks on spark local[3]" in everything
    assert "[0] rank 0: 674 training rows" in everything and "[1] rank 1: 673 training rows" \
        in everything
    after = float(re.search(r"test accuracy after 3 epochs on the warm pool: (\d\.\d+)",
                            everything).group(1))
    assert after >= 0.85
    assert "spark local[3] (warm pool)" in everything
    assert re.search(r"dealt 'digits_df' to the pool's 2 ranks: 1,797 rows in \d+\.\d s",
                     everything)
    assert "rank 0 holds 899 of 1797 rows" in everything
    assert "rank 1 holds 898 of 1797 rows" in everything
    accuracy = float(re.search(r"accuracy on the 1797 rows of the DataFrame: (\d\.\d+)",
                               everything).group(1))
    assert accuracy >= 0.85
    assert ("the shards of 'digits_df' dealt earlier were reused (1,797 rows; same "
            "plan and data: rows in the plan)") in everything
    assert "the same DataFrame again, on rank 0: 899 rows" in everything
    assert "TypeError" in everything and "still here: accuracy" in everything
    assert "5 cells run" in everything or "6 cells run" in everything
    assert "has ended; its slots are free" in everything
    assert "[Stage" not in everything  # Spark's console bar is off while the pool runs


def test_the_ddp_notebook(tmp_path):
    nb, texts, everything = _run("ddp.ipynb", tmp_path, EPOCHS=3, DROP_IN_STEPS=5)
    accuracy = float(re.search(r"test accuracy with DDP on 2 ranks: (\d\.\d+)", everything).group(1))
    assert accuracy >= 0.85
    assert "[0] Epoch 3/3" in everything
    assert re.search(r"\n  engine +torch\.distributed\n", everything)  # the record's column
    assert re.search(r"\n  steps of rank 1 +\d+ steps of [\d.]+ s: input \d+% · compute", everything)
    bars = _widget_models(nb, "IntProgressModel")
    assert len(bars) == 6  # the DDP cell's, the drop-in's, the failing cell's
    assert [b["bar_style"] for b in bars[:4]] == ["success"] * 4
    assert bars[0]["value"] == bars[0]["max"] > 0  # the DDP loop's progress filled its bar
    # the failing cell: both ranks raise, but one may be stopped first when the other's
    # failure ends the job (a loaded machine): failed or stopped, never done
    failing = [b["bar_style"] for b in bars[4:]]
    assert "danger" in failing and set(failing) <= {"danger", "warning"}, failing
    assert re.search(r"TorchDistributor drop-in: final loss \d\.\d+ on rank 0", everything)
    assert ("WrongEngineError: hvd.init() was called, but this job runs on the torch engine"
            in everything)
    assert "the kernel is still fine" in everything


def test_the_tf_distribute_notebook(tmp_path):
    nb, texts, everything = _run("tf-distribute.ipynb", tmp_path, EPOCHS=4)
    accuracy = float(re.search(r"MultiWorkerMirroredStrategy on 2 workers: (\d\.\d+)",
                               everything).group(1))
    assert accuracy >= 0.85
    assert re.search(r"engine +tf\.distribute", everything)
    bars = _widget_models(nb, "IntProgressModel")
    assert len(bars) == 2 and all(b["bar_style"] == "success" and b["value"] == b["max"] > 0
                                  for b in bars)
    assert re.search(r"\n\s+4\s+\d+\.\d+", everything)  # four epochs timed


def test_the_hugging_face_and_lightning_notebook(tmp_path):
    """A Hugging Face Trainer (a BERT from its config) and a Lightning Trainer on a DataFrame's
    shards, on 2 ranks of local Spark: both learn, their epochs are in the timing, the cell
    shows no bar, log dictionary, tip or repeated warning, and a shard handed to the Trainer is
    refused with the fix."""
    epochs = 2
    nb, texts, everything = _run("hugging-face-and-lightning.ipynb", tmp_path, EPOCHS=epochs)
    hf = float(re.search(r"Hugging Face Trainer on 2 ranks: test accuracy (\d\.\d+)",
                         everything).group(1))
    lightning = float(re.search(r"Lightning on 2 ranks, on the DataFrame's shards: test "
                                r"accuracy (\d\.\d+)", everything).group(1))
    assert hf >= 0.9 and lightning >= 0.9, (hf, lightning)
    rows = int(re.search(r"(\d+) training rows", everything).group(1))
    # every epoch of each, every training row once per epoch (the Trainer pads none in)
    for run in ("hf", "lightning"):
        table = next(t for t in texts if f"on 2 ranks" in t and "epoch  wall_s  samples" in t
                     and (run == "hf") == ("Hugging Face" in t))
        lines = table[table.index("epoch  wall_s  samples"):].splitlines()[1:]
        assert [int(line.split()[-1]) for line in lines] == [rows] * epochs, table
    assert "ShardDealtAgainError: the Trainer's train_dataset holds this rank's shard of " \
           "train_df" in everything
    for chatter in ("{'loss'", "{'eval_loss'", "it/s]", "\x1b[2K", "\x1b[?25h", "Tip:",
                    "GPU available", "fit` stopped"):
        assert chatter not in everything, chatter
    assert everything.count("find_unused_parameters") <= 1
    assert everything.count("Total params") == 1  # Lightning's summary, rank 0's alone
    assert "Traceback" not in everything and "Py4J" not in everything
