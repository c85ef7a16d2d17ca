"""Jobs recorded in MLflow from the driver: against a real `mlflow server` on loopback (SQLite
backend, local artifact store) started here, and against MLflow's local default store."""
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import pytest

from hvd_magics import HorovodJobError, HorovodRunner, JobInterrupted, last_run
from hvd_magics.job.session import SESSION
from tests import jobs
from tests.conftest import ROOT
from tests.standalone import _free_port


#: MLflow 3's server also starts a job runner and seven huey consumers (server-side jobs for its
#: GenAI features, which no test uses): 10 processes and 20 CPU seconds a start, 2 and 6 without.
SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def start_server(folder, port: int) -> subprocess.Popen:
    """A real MLflow tracking server on loopback at ``port``, keeping its runs in ``folder``;
    returns once it answers."""
    uri = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{folder}/mlflow.db",
         "--artifacts-destination", str(folder / "artifacts"), "--workers", "1"],
        stdout=open(folder / "server.log", "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
        start_new_session=True, env={**os.environ, **SERVER_ENV})
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2):
                return server
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("mlflow server did not start: "
                                   + (folder / "server.log").read_text()[-2000:]) from None
            time.sleep(0.2)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow tracking server on loopback; its URI."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    server = start_server(folder, port)
    yield f"http://127.0.0.1:{port}"
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(30)


@pytest.fixture()
def tracking(mlflow_server):
    import mlflow

    mlflow.set_tracking_uri(mlflow_server)
    yield mlflow.MlflowClient(mlflow_server)
    while mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)


def _history(client, run_id, key):
    return [(m.step, round(m.value, 6)) for m in client.get_metric_history(run_id, key)]


def test_a_run_on_the_server_has_params_epoch_metrics_and_artifacts(tracking, local_spark,
                                                                   capfd):
    assert HorovodRunner(np=2, mlflow="hvd-tests").run(jobs.rank_metrics, epochs=3) == "ok"
    assert "View run" not in capfd.readouterr().out  # the summary links it, once
    record = last_run()
    run = tracking.get_run(record.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == f"horovod-{record.job_id}"
    assert tracking.get_experiment(run.info.experiment_id).name == "hvd-tests"
    params = run.data.params
    assert params["np"] == "2" and params["where"] == "spark local[2]"
    assert params["horovod_version"] == "0.28.1" and params["batch_size"] == "8"
    # one value per epoch, step = epoch, averaged over the two ranks
    assert _history(tracking, run.info.run_id, "score") == [(1, 1.5), (2, 2.5), (3, 3.5)]
    assert _history(tracking, run.info.run_id, "loss") == [(1, 6.0), (2, 7.0), (3, 8.0)]
    assert [s for s, _ in _history(tracking, run.info.run_id, "epoch_wall_s")] == [1, 2, 3]
    artifacts = {a.path for a in tracking.list_artifacts(run.info.run_id)}
    assert artifacts == {"ranks.log", "epoch_timing.csv", "source.py"}
    csv_text = open(tracking.download_artifacts(run.info.run_id, "epoch_timing.csv")).read()
    assert csv_text.splitlines()[0].startswith("epoch,wall_s,") and len(csv_text.splitlines()) == 4
    source = open(tracking.download_artifacts(run.info.run_id, "source.py")).read()
    assert source.startswith("def rank_metrics(")
    # the summary links the run in the server's UI
    assert f"#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}" in record.mlflow
    assert "mlflow" in str(record)


def test_a_ddp_run_is_tracked_with_its_engine_and_epoch_metrics(tracking):
    from tests import engine_jobs

    HorovodRunner(np=-2, engine="torch", mlflow="hvd-tests").run(engine_jobs.ddp_mlp, epochs=2,
                                                                  steps=5)
    run = tracking.get_run(last_run().mlflow_run_id)
    assert run.info.status == "FINISHED" and run.data.params["engine"] == "torch"
    assert [step for step, _ in _history(tracking, run.info.run_id, "loss")] == [1, 2]
    # each rank's step split: its mean parts as metrics, every interval as a CSV
    split = {row["rank"]: row for row in last_run().step_split}
    assert run.data.metrics["rank_1.comm_s"] == pytest.approx(split[1]["comm_s"])
    assert {"rank_0.step_s", "rank_0.input_s", "rank_0.compute_s"} <= set(run.data.metrics)
    assert "step_split.csv" in {a.path for a in tracking.list_artifacts(run.info.run_id)}


def test_a_restarted_job_is_one_run_tagged_with_each_attempt(tracking, tmp_path):
    from tests import engine_jobs

    runner = HorovodRunner(np=-2, engine="torch", restarts=1, checkpoint_dir=tmp_path,
                           mlflow="hvd-tests")
    assert runner.run(engine_jobs.steps_with_checkpoints, kill_on=(12, [0]))["attempt"] == 1
    record = last_run()
    run = tracking.get_run(record.mlflow_run_id)
    tags = run.data.tags
    assert run.info.status == "FINISHED" and "hvd_magics.error" not in tags
    assert tags["hvd_magics.attempt"] == "2" and tags["hvd_magics.attempt_2.job_id"] == \
        record.job_id
    assert "rank 1" in tags["hvd_magics.attempt_1.ended"], tags
    # the second attempt went on in the first's run: no run of its own
    found = tracking.search_runs([run.info.experiment_id],
                                 f"tags.`hvd_magics.job_id` = '{record.job_id}'")
    assert found == []
    files = {f.path for f in tracking.list_artifacts(run.info.run_id)}
    files |= {f.path for f in tracking.list_artifacts(run.info.run_id, "attempt_2")}
    assert {"ranks.log", "source.py", "attempt_2/ranks.log"} <= files, files


def test_failures_and_interrupts_end_the_run_as_such(tracking, tmp_path):
    with pytest.raises(HorovodJobError):
        HorovodRunner(np=-2, mlflow=True).run(jobs.fail_on_rank, bad_rank=1, how="raise")
    failed = tracking.get_run(last_run().mlflow_run_id)
    assert failed.info.status == "FAILED"
    assert "boom from rank 1" in failed.data.tags["hvd_magics.error"]

    pid_file = str(tmp_path / "child")

    def interrupt_when_running():
        deadline = time.monotonic() + 120
        while not all(os.path.exists(f"{pid_file}.{r}") for r in (0, 1)):
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_running, daemon=True).start()
    with pytest.raises(JobInterrupted):
        HorovodRunner(np=-2, mlflow=True).run(jobs.start_children_and_wait, pid_file=pid_file)
    assert tracking.get_run(last_run().mlflow_run_id).info.status == "KILLED"


def test_an_active_run_gets_a_nested_run_and_the_session_switch_works(tracking, ip, capsys):
    import mlflow

    cell = "import os\nprint('rank', os.environ['HOROVOD_RANK'])\n6 * 7\n"
    with mlflow.start_run(run_name="notebook") as parent:
        assert ip.run_cell_magic("horovod", "np=-1 -q", cell) == 42
    nested = tracking.get_run(last_run().mlflow_run_id)
    assert nested.data.tags["mlflow.parentRunId"] == parent.info.run_id
    assert open(tracking.download_artifacts(nested.info.run_id, "source.py")).read() == cell
    # no active run, nothing asked: not recorded
    ip.run_cell_magic("horovod", "np=-1 -q", cell)
    assert last_run().mlflow_run_id is None
    ip.run_line_magic("hvd_mlflow", "on session-exp")
    try:
        ip.run_cell_magic("horovod", "np=-1 -q", cell)
        run = tracking.get_run(last_run().mlflow_run_id)
        assert tracking.get_experiment(run.info.experiment_id).name == "session-exp"
        ip.run_cell_magic("horovod", "np=-1 -q --no-mlflow", cell)
        assert last_run().mlflow_run_id is None
    finally:
        ip.run_line_magic("hvd_mlflow", "off")
    assert SESSION.mlflow is None
    assert "MLflow tracking is on: every %%horovod run is recorded in experiment " \
           "'session-exp'" in capsys.readouterr().out


def test_a_server_that_is_down_gives_one_warning_and_the_job_goes_on():
    import mlflow

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    mlflow.set_tracking_uri(f"http://127.0.0.1:{port}")
    try:
        started = time.monotonic()
        with pytest.warns(UserWarning, match="MLflow tracking at http://127.0.0.1:.* failed "
                                             ".*the job goes on without it") as caught:
            assert HorovodRunner(np=-1, mlflow=True).run(jobs.print_lines, count=1) == 0
        assert len([w for w in caught if "MLflow" in str(w.message)]) == 1
        assert time.monotonic() - started < 30
        assert last_run().status == "succeeded" and last_run().mlflow.startswith("not recorded")
    finally:
        mlflow.set_tracking_uri(None)


LOCAL_STORE = textwrap.dedent('''
    import sys
    sys.path.insert(0, {root!r})
    import cloudpickle
    from tests import jobs
    cloudpickle.register_pickle_by_value(jobs)
    from hvd_magics import HorovodRunner, last_run
    HorovodRunner(np=-1, mlflow=True).run(jobs.rank_metrics, epochs=2)
    print("RECORD", last_run().mlflow)
    import mlflow
    run = mlflow.MlflowClient().get_run(last_run().mlflow_run_id)
    print("STATUS", run.info.status, sorted(run.data.metrics))
''')


def test_without_a_tracking_uri_runs_go_to_the_local_default_store(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    proc = subprocess.run([sys.executable, "-c", LOCAL_STORE.format(root=str(ROOT))], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(no tracking URI was set: MLflow's local default store)" in proc.stdout
    assert "STATUS FINISHED ['epoch_wall_s', 'loss', 'samples_per_s', 'score']" in proc.stdout
    assert any(p.name.startswith("mlflow") for p in tmp_path.iterdir())  # the store, in the cwd


MISSING = textwrap.dedent('''
    import sys
    sys.modules["mlflow"] = None  # as if it were not installed
    from hvd_magics import HorovodRunner, MlflowMissing
    try:
        HorovodRunner(np=-1, mlflow=True)
    except MlflowMissing as exc:
        print("MISSING", exc)
    from IPython.testing.globalipapp import start_ipython
    from IPython.core.error import UsageError
    ip = start_ipython()
    ip.run_line_magic("load_ext", "hvd_magics")
    try:
        ip.run_cell_magic("horovod", "np=-1 --mlflow", "1")
    except UsageError as exc:
        print("USAGE", exc)
''')


def test_without_mlflow_the_option_says_how_to_install_it():
    proc = subprocess.run([sys.executable, "-c", MISSING], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "MISSING MLflow tracking needs the mlflow package in the notebook's Python: pip " \
           "install 'hvd_magics[mlflow]'" in proc.stdout
    assert "USAGE %%horovod --mlflow: MLflow tracking needs the mlflow package" in proc.stdout


def test_an_estimator_fit_logs_its_model_with_flavour_and_signature(tracking, local_spark):
    import mlflow
    import numpy as np

    from hvd_magics.estimator import HorovodEstimator
    from tests.estimator_models import torch_mlp
    from tests.frames import digits_frames

    train, val = digits_frames(local_spark)
    fitted = HorovodEstimator(model=torch_mlp(), loss="cross_entropy", metrics=["accuracy"],
                              learningRate=0.003, epochs=2, np=2, featuresCol="pixels",
                              validationFraction=0.2, mlflow="hvd-estimator").fit(train)
    record = fitted.run_record
    run = tracking.get_run(record.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert [s for s, _ in _history(tracking, run.info.run_id, "val_accuracy")] == [1, 2]
    assert record.mlflow_model_uri and record.mlflow_model_uri.startswith("models:/")
    logged = mlflow.pyfunc.load_model(record.mlflow_model_uri)
    assert logged.metadata.flavors.keys() >= {"pytorch", "python_function"}
    assert str(logged.metadata.signature.inputs).startswith("[Tensor('float32', (-1, 64))")
    rows = fitted.transform(val).limit(10).collect()
    outputs = logged.predict(np.array([r["pixels"] for r in rows], dtype=np.float32))
    assert np.asarray(outputs).argmax(1).tolist() == [int(r["prediction"]) for r in rows]


def _wait_until(condition, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = condition()
        except Exception:  # noqa: BLE001 - the server may still be coming up
            value = None
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.2)


def test_a_server_killed_mid_job_gets_the_rest_of_the_run_when_it_is_back(tmp_path,
                                                                          monkeypatch):
    """The run stayed RUNNING forever with epoch-1 metrics and no artifacts."""
    import mlflow

    from hvd_magics.protocol import ENV_MLFLOW_RETRY_S

    monkeypatch.setenv(ENV_MLFLOW_RETRY_S, "0.5")  # the setting, not a patched constant
    folder, marks = tmp_path / "server", tmp_path / "marks"
    folder.mkdir()
    marks.mkdir()
    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_server(folder, port)
    client = mlflow.MlflowClient(uri)
    mlflow.set_tracking_uri(uri)

    def kill_after_epoch_1():
        _wait_until(lambda: (marks / "epoch1").exists())
        run_id = _wait_until(lambda: client.search_runs(
            [client.get_experiment_by_name("held").experiment_id])[0].info.run_id)
        _wait_until(lambda: _history(client, run_id, "score"))
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(30)
        (marks / "go").touch()

    killer = threading.Thread(target=kill_after_epoch_1, daemon=True)
    killer.start()
    try:
        with pytest.warns(UserWarning, match="What is left is written when it answers again"):
            started = time.monotonic()
            assert HorovodRunner(np=-1, mlflow="held").run(jobs.rank_metrics_held,
                                                           marks=str(marks)) == "ok"
        killer.join(60)
        record = last_run()
        assert record.status == "succeeded" and time.monotonic() - started < 60
        assert "writes (metrics, artifacts, the run's end) are kept and written when the " \
               "server answers again" in record.mlflow, record.mlflow
        again = start_server(folder, port)
        try:
            run = _wait_until(lambda: (r := client.get_run(record.mlflow_run_id)).info.status
                              == "FINISHED" and r)
            assert _history(client, run.info.run_id, "score") == [(1, 1.0), (2, 2.0), (3, 3.0)]
            assert {a.path for a in client.list_artifacts(run.info.run_id)} == {
                "ranks.log", "epoch_timing.csv", "source.py"}
            _wait_until(lambda: "completed at" in record.mlflow)
        finally:
            os.killpg(again.pid, signal.SIGTERM)
            again.wait(30)
    finally:
        mlflow.set_tracking_uri(None)


def test_a_trainer_that_records_itself_in_mlflow_is_named_beside_the_job_s_run(tracking,
                                                                              tmp_path):
    """transformers' MLflowCallback (report_to=["mlflow"]) makes a run of its own from rank 0:
    the summary says who, where, and how to keep one run."""
    from tests import engine_jobs

    uri = tracking.tracking_uri
    HorovodRunner(np=-2, engine="torch", mlflow="hvd-tests",
                  env={"MLFLOW_TRACKING_URI": uri}).run(
        engine_jobs.hf_trainer_fit, out=str(tmp_path), report_to=("mlflow",))
    record = last_run()
    assert f"also recorded in a run of its own by transformers on rank 0 in {uri}: one job, " \
           "two runs. Keep this one with TrainingArguments(report_to=[])" in record.mlflow, \
        record.mlflow
    ours = tracking.get_run(record.mlflow_run_id)
    theirs = [run for run in tracking.search_runs([ours.info.experiment_id, "0"])
              if run.info.run_id != ours.info.run_id and "train_loss" in run.data.metrics]
    assert theirs, "the Trainer's own run is on the server"
