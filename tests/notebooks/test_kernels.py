"""The extension loads in real Jupyter kernels: by %load_ext, and by the opt-in kernelspec."""
import os

import pytest
from jupyter_client.manager import start_new_kernel


def _messages(client, code: str) -> list[dict]:
    """Execute ``code``; every iopub message it caused, until the kernel is idle again."""
    msg_id = client.execute(code)
    messages = []
    while True:
        msg = client.get_iopub_msg(timeout=120)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(msg)
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return messages


def _run(client, code: str, displays: bool = False) -> str:
    """Execute ``code``; return its text/plain result or its stream output (and what it
    displayed, with ``displays``)."""
    text = []
    for msg in _messages(client, code):
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            text.append(content["text"])
        elif kind == "execute_result" or (kind == "display_data" and displays):
            text.append(content["data"].get("text/plain", ""))
        elif kind == "error":
            text.append(content["ename"] + ": " + content["evalue"])
    return "".join(text)


@pytest.mark.parametrize("kernel, setup", [("python3", "%load_ext hvd_magics"),
                                           ("hvd-magics", "")])
def test_horovod_magic_is_registered_in_a_fresh_kernel(kernel, setup):
    manager, client = start_new_kernel(kernel_name=kernel)
    try:
        before = _run(client, "'horovod' in get_ipython().magics_manager.magics['cell']")
        if setup:
            assert before.strip() == "False"
            _run(client, setup)
        assert _run(client, "'horovod' in get_ipython().magics_manager.magics['cell']").strip() == "True"
        assert _run(client, "%%horovod np=-1 -q\n6 * 7\n").strip() == "42"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


FIT_CELL = """%%horovod np=-2 -q
import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd
hvd.init()
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), "mse")
model.fit(x, x.sum(axis=1), epochs=1, verbose=0)
"""


def test_a_cell_ending_in_model_fit_keeps_tensorflow_out_of_the_kernel():
    """Regression: the History was unpickled in the kernel: TensorFlow imported, then
    'Could not locate class SGD', the dashboard stuck at running, no summary."""
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        _run(client, "%load_ext hvd_magics")
        shown = _run(client, FIT_CELL, displays=True)
        assert "History object" in shown and "would import tf_keras" in shown, shown
        assert "--return NAME" in shown
        assert "HorovodRun" in shown and "succeeded" in shown  # the summary was shown
        assert _run(client, "import sys; 'tensorflow' in sys.modules").strip() == "False"
        assert _run(client, "import hvd_magics; hvd_magics.last_run().status").strip() == \
            "'succeeded'"
        # asked for by name, plain data comes back...
        weights = _run(client, FIT_CELL.replace("-q\n", "-q --return weights\n")
                       + "weights = model.get_weights()\n", displays=True)
        assert "succeeded" in weights
        assert _run(client, "[w.shape for w in weights]").strip() == "[(4, 1), (1,)]"
        # ...and an object that cannot be decoded here fails the run, naming its type
        failed = _run(client, FIT_CELL.replace("-q\n", "-q --return model\n"), displays=True)
        assert "HorovodJobError: rank 0's 'model' (a tf_keras.src.engine.sequential.Sequential) " \
               "could not be decoded in the notebook" in failed
        assert _run(client, "hvd_magics.last_run().status").strip() == "'failed'"
        assert _run(client, "%%horovod np=-1 -q\n1 + 1\n").strip() == "2"  # still usable
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_warm_pool_keeps_variables_across_cells_and_dies_with_its_kernel(tmp_path):
    """A fresh kernel with its own local[2] session: the pool's ranks keep what one cell made
    for the next one, and shutting the kernel down leaves none of them running."""
    import time

    from tests.conftest import rank_processes_alive

    # as in a notebook, the kernel forwards what the JVM writes to its stderr into the cell
    # (ipykernel does not when it sees PYTEST_CURRENT_TEST)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    manager, client = start_new_kernel(kernel_name="python3", env=env)
    try:
        _run(client, "%load_ext hvd_magics")
        _run(client, "from pyspark.sql import SparkSession\n"
                     "spark = SparkSession.builder.master('local[2]').getOrCreate()")
        # Spark's console bar is off while a pool runs (it drew the pool's stage into a cell
        # every minute), and a new one is there when the pool has ended
        bar = "spark.sparkContext._jsc.sc().progressBar().isDefined()"
        # and while a cold job's stage runs (it drew "[Stage 0:> (0 + 2) / 2]" into the cell);
        # the job lasts well past the half second after which Spark draws a stage
        cold = _run(client, "%%horovod np=2 -q\nimport time\ntime.sleep(2)\n'slept'")
        assert "slept" in cold and "[Stage" not in cold, cold
        assert _run(client, bar).strip() == "True"
        assert "[Stage" not in _run(client, "%hvd_pool start np=1")
        assert _run(client, bar).strip() == "False"
        _run(client, "%hvd_pool stop")
        assert _run(client, bar).strip() == "True"
        started = _run(client, "%hvd_pool start np=2")
        assert "2 warm ranks on spark local[2]" in started, started
        _run(client, f"%%horovod -q\nimport os\nmarker = os.getpid()\n"
                     f"open(os.path.join({str(tmp_path)!r}, str(marker)), 'w').close()")
        assert _run(client, "%%horovod -q\nimport os\nmarker == os.getpid()").strip() == "True"
        pids = [int(p.name) for p in tmp_path.iterdir()]
        assert len(pids) == 2 and rank_processes_alive(pids) == pids
        assert "cells run" in _run(client, "%hvd_pool")
    finally:
        client.stop_channels()
        manager.shutdown_kernel()  # as the notebook's shutdown does: atexit hooks run
    deadline = time.monotonic() + 30
    while rank_processes_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rank_processes_alive(pids) == []


def test_a_background_job_leaves_the_kernel_free_and_dies_with_it(tmp_path):
    """A fresh kernel with its own local[2] session: the cell returns at once, its dashboard is
    drawn in that cell, other cells run while the job does, %hvd_stacks shows where the ranks
    are, and shutting the kernel down leaves no rank running."""
    import time

    from tests.conftest import rank_processes_alive

    manager, client = start_new_kernel(kernel_name="python3")
    try:
        _run(client, "%load_ext hvd_magics")
        _run(client, "from pyspark.sql import SparkSession\n"
                     "spark = SparkSession.builder.master('local[2]').getOrCreate()")
        started = _run(client, f"%%horovod np=2 --background -o job\nimport os, time\n"
                               f"open(os.path.join({str(tmp_path)!r}, str(os.getpid())), "
                               f"'w').close()\ndef training():\n    time.sleep(600)\ntraining()",
                       displays=True)
        # the dashboard's place, taken at once; its plain text says what it is (not a repr)
        assert "runs in the background" in started and "live dashboard of a job" in started, \
            started
        assert "VBox(" not in started
        assert _run(client, "6 * 7").strip() == "42"  # the kernel is free
        deadline = time.monotonic() + 120
        while len(list(tmp_path.iterdir())) < 2:
            assert time.monotonic() < deadline, _run(client, "job")
            time.sleep(0.2)
        pids = [int(p.name) for p in tmp_path.iterdir()]
        stacks = _run(client, "%hvd_stacks job")
        assert stacks.count("training") >= 2 and "time.sleep(600)" in stacks, stacks
        assert "running" in _run(client, "job")
    finally:
        client.stop_channels()
        manager.shutdown_kernel()  # as the notebook's shutdown does: atexit hooks run
    deadline = time.monotonic() + 60
    while rank_processes_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rank_processes_alive(pids) == []


def test_a_fit_refused_for_nulls_leaves_only_its_error_in_the_cell():
    """The ranks start early to import while the rows arrive; a fit refused for nulls drew
    their dashboard before its one-line error (and left it there)."""
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        _run(client, "%load_ext hvd_magics")
        _run(client, "from pyspark.sql import SparkSession\n"
                     "spark = SparkSession.builder.master('local[2]').getOrCreate()\n"
                     "rows = [([float(i), 1.0], None if i % 3 == 0 else i % 2)\n"
                     "        for i in range(60)]\n"
                     "bad = spark.createDataFrame(rows, 'x array<float>, y int')\n"
                     "def build():\n    import torch\n    return torch.nn.Linear(2, 2)\n")
        messages = _messages(client, "from hvd_magics import HorovodEstimator\n"
                                     "HorovodEstimator(model=build, loss='cross_entropy', "
                                     "featuresCol='x', labelCol='y', np=2, epochs=1).fit(bad)")
        errors = [m["content"] for m in messages if m["msg_type"] == "error"]
        assert [e["ename"] for e in errors] == ["EstimatorInputError"], errors
        assert "labelCol 'y' has 20 null values" in errors[0]["evalue"]
        shown: dict[str, dict] = {}  # display id -> what it shows last
        for m in messages:
            if m["msg_type"] in ("display_data", "update_display_data"):
                key = m["content"].get("transient", {}).get("display_id") or m["header"]["msg_id"]
                shown[key] = m["content"]["data"]
        left = [data for data in shown.values() if data.get("text/plain", "").strip()
                or "application/vnd.jupyter.widget-view+json" in data]
        assert left == [], left
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_background_job_stopped_during_its_start_says_stopped_and_nothing_else():
    """job.stop() while the tasks were still starting dumped Spark's ERROR Executor tracebacks
    into the cell, with a TaskSetupError advising HVD_MAGICS_DRIVER_HOST (the stop had closed
    the channel the tasks were connecting to). A stop whose stage had to be cancelled (its tasks
    slow to end, as on a busy machine: forced in the last run) printed Spark's WARN TaskSetManager
    line for each killed task."""
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    manager, client = start_new_kernel(kernel_name="python3", env=env)  # JVM stderr in cells
    try:
        _run(client, "%load_ext hvd_magics")
        _run(client, "from pyspark.sql import SparkSession\n"
                     "spark = SparkSession.builder.master('local[2]').getOrCreate()\n"
                     "spark.range(1).count()")
        shown = _run(client, "import time\nfrom hvd_magics import HorovodRunner\n"
                             "def train():\n    import time\n    time.sleep(60)\n"
                             "for delay in (0.0, 0.3, 1.0, 2.0):\n"
                             "    job = HorovodRunner(np=2).start(train)\n"
                             "    time.sleep(delay)  # stopped at another point of its start\n"
                             "    job.stop()\n"
                             "    try:\n        job.wait()\n"
                             "    except KeyboardInterrupt as exc:\n"
                             "        print('stopped:', str(exc)[:40])\n"
                             "import hvd_magics.launch.spark_backend as backend\n"
                             "backend.CANCEL_AFTER_S = backend.CANCEL_LATE_TASKS_AFTER_S = 0.0\n"
                             "job = HorovodRunner(np=2).start(train)\n"
                             "time.sleep(5.0)  # its ranks run: the stop cancels the stage\n"
                             "job.stop()\n"
                             "try:\n    job.wait()\n"
                             "except KeyboardInterrupt as exc:\n"
                             "    print('stopped:', str(exc)[:40])\n")
        # what the JVM printed late: Spark warns of a killed task before its end is counted
        shown += _run(client, "tracker = spark.sparkContext.statusTracker()\n"
                              "while any(getattr(tracker.getStageInfo(stage), 'numActiveTasks', 0)\n"
                              "          for stage in range(50)):\n"
                              "    time.sleep(0.1)\n"
                              "spark.range(1).count()")
        shown += _run(client, "spark.range(1).count()")  # the kernel forwards the JVM's lines late
        assert shown.count("stopped: stopped 2 rank processes") == 5, shown
        for noise in ("ERROR", "Exception in task", "TaskSetupError", "Lost task", "WARN"):
            assert noise not in shown, shown
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
