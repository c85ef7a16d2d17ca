"""A local Spark Connect session (pyspark starts the Connect server): no SparkContext, no RDDs.

Run in a subprocess: a Connect server runs a SparkContext of its own in the process that starts
it, which cannot live beside the other tests' classic session. One worker process
(:mod:`tests.spark_connect.connect_worker`) holds the session; each test runs one scenario on it.
"""
import json
import os
import queue
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

class ConnectWorker:
    """The client process of :mod:`tests.spark_connect.connect_worker`: one Connect session for
    the module, one scenario per test (started again when a scenario took it down)."""

    def __init__(self, log_dir: Path, python: str = sys.executable) -> None:
        self.log_dir = log_dir
        self.python = python  # what the server's Python workers run
        self.proc: subprocess.Popen | None = None
        self.lines: queue.Queue = queue.Queue()

    def _start(self) -> None:
        # A Connect server's Python workers use PYSPARK_PYTHON as the server saw it at start
        # (spark.pyspark.python cannot be changed on a running Connect session).
        env = {**os.environ, "PYSPARK_PYTHON": self.python}
        log = open(self.log_dir / "connect-worker.err", "a")  # noqa: SIM115 - the JVM's chatter
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.spark_connect.connect_worker"], cwd=ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self.lines), daemon=True).start()
        self._expect("@@ready", 300)

    @staticmethod
    def _read(proc: subprocess.Popen, lines: queue.Queue) -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def _expect(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise AssertionError("the Connect worker ended: "
                                     + (self.log_dir / "connect-worker.err").read_text()[-3000:])
            if line.startswith(prefix):
                return line[len(prefix):]

    def run(self, scenario: str, out_dir: Path, timeout: float = 300) -> dict:
        """Run one scenario; its ``out``, ``err`` and ``error`` (a traceback, or None)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.proc.stdin.write(f"{scenario} {out_dir}\n")
        self.proc.stdin.flush()
        try:
            return json.loads(self._expect("@@result ", timeout))
        except queue.Empty:
            self.close()
            raise AssertionError(f"scenario {scenario} ran past {timeout} s") from None

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def connect(tmp_path_factory):
    worker = ConnectWorker(tmp_path_factory.mktemp("connect"))
    yield worker
    worker.close()


def _ran(result: dict) -> str:
    assert result["error"] is None, result["error"] + result["out"][-2000:]
    return result["out"]


def test_a_job_runs_on_a_spark_connect_session(connect, tmp_path):
    assert "sums [3.0, 3.0] where spark local[2] (Connect)" in _ran(connect.run("allreduce",
                                                                                tmp_path))


def test_a_failing_rank_names_itself_and_the_next_job_runs(connect, tmp_path):
    out = _ran(connect.run("a_failing_rank_then_a_clean_job", tmp_path))
    assert "error rank 1 on" in out and "ValueError: boom from rank 1" in out
    assert "again 0" in out


def test_an_interrupt_cancels_the_job_by_its_tag_and_kills_what_the_ranks_started(connect,
                                                                                    tmp_path):
    out = _ran(connect.run("an_interrupt", tmp_path))
    assert "interrupted stopped 2 rank processes and cancelled Spark job group" in out, out
    assert "children left []" in out and "after 0" in out


def test_dataframes_of_a_connect_session_reach_the_ranks_as_disjoint_shards(connect, tmp_path):
    assert "shards 400 True train" in _ran(connect.run("shards", tmp_path))


def test_torch_trains_on_the_shards_of_a_connect_session(connect, tmp_path):
    assert "torch accuracy True" in _ran(connect.run("torch_on_dataframes", tmp_path))


def test_ddp_trains_on_the_shards_of_a_connect_session(connect, tmp_path):
    assert "ddp 1 [3.0, 3.0] torch spark local[2] (Connect)" in _ran(
        connect.run("ddp_on_dataframes", tmp_path))


def test_the_estimator_fits_transforms_saves_and_loads_on_connect(connect, tmp_path):
    assert "estimator torch 2 True True" in _ran(connect.run("estimator", tmp_path))


def test_the_notebooks_environment_travels_to_a_connect_servers_executors(connect, tmp_path):
    result = connect.run("shipped_environment", tmp_path)
    assert "shipped 1.0 1.0 False True" in _ran(result), result
    # sent once to the session (addArtifacts), not again with the second job
    assert result["err"].count("sent the environment to the executors") == 1, result["err"]


def test_a_session_that_asks_for_tls_refuses_the_job_as_pysparks_distributor_does(connect,
                                                                                     tmp_path):
    out = _ran(connect.run("tls_refused", tmp_path))
    assert ("refused spark.ssl.enabled=true asks for data encryption in transit, which the ranks' "
            "training traffic (Horovod's, Gloo's, NCCL's) does not have. Fix: to train "
            'unencrypted anyway, spark.conf.set("pytorch.spark.distributor.ignoreSsl", "true")'
            ) in out and "ran False" in out, out
    assert "pyspark refused too: True" in out and "allowed 0" in out


def test_too_many_ranks_for_the_connect_cluster_are_refused_with_its_slots(connect, tmp_path):
    assert ("slots np=3 needs 3 free Spark task slots at once (barrier mode), but the cluster "
            "has 2 free of 2 (master local[2]") in _ran(connect.run("too_many_ranks", tmp_path))


def test_an_elastic_job_on_connect_goes_on_when_a_task_is_lost(connect, tmp_path):
    out = _ran(connect.run("elastic_loses_a_task", tmp_path))
    assert "elastic [(1, 40)] [(1, ['the rank of task 1 exited with code -9'])]" in out, out


def test_a_warm_pool_on_connect_keeps_its_ranks_restarts_when_stuck_and_frees_its_slots(
        connect, tmp_path):
    out = _ran(connect.run("warm_pool", tmp_path))
    assert "pool spark local[2] (Connect) (warm pool) True True" in out, out
    assert "pool stuck True" in out and "pool after None" in out
    assert "cold after the pool 0" in out


def test_a_dataframe_is_dealt_to_a_warm_pool_on_connect_when_a_slot_is_free(connect, tmp_path):
    out = _ran(connect.run("pool_dataframe", tmp_path))
    assert ("pool full the cell reads the DataFrame 'train', but dealing its rows to the warm "
            "pool needs one free Spark task slot beside the 2 the pools hold") in out, out
    assert "pool shards 400" in out and "pool reused True" in out, out


def test_without_a_live_view_a_warm_pool_is_refused_with_the_reason(connect, tmp_path):
    assert ("quiet pool a warm pool sends its cells over the notebook's event channel, which "
            "the executors cannot use here: HVD_MAGICS_LIVE=0 is set" in
            _ran(connect.run("quiet_pool", tmp_path)))


def test_without_a_live_view_the_cell_says_why_and_the_output_and_value_come_back(connect,
                                                                                   tmp_path):
    result = connect.run("quiet_value", tmp_path)
    out = _ran(result)
    assert "hvd_magics: no live view: HVD_MAGICS_LIVE=0 is set. The ranks' output" \
        in result["err"], result["err"]
    assert "[1] line 2 of rank 1" in out and "quiet value 0" in out


def test_without_a_live_view_a_failing_rank_still_names_itself(connect, tmp_path):
    out = _ran(connect.run("quiet_error", tmp_path))
    assert "quiet error rank 1 on" in out and "boom from rank 1" in out


def test_without_a_live_view_dataframes_still_reach_the_ranks(connect, tmp_path):
    assert "quiet shards 400" in _ran(connect.run("quiet_shards", tmp_path))


def test_without_a_live_view_an_elastic_job_is_refused_with_the_reason(connect, tmp_path):
    assert ("quiet elastic an elastic job hands out ranks over the notebook's event channel, "
            "which the executors cannot use here: HVD_MAGICS_LIVE=0 is set"
            in _ran(connect.run("quiet_elastic", tmp_path)))


SERVER_SCRIPT = textwrap.dedent('''
    import socket, threading, time
    from pyspark.sql import SparkSession
    # a classic session whose JVM serves Spark Connect (what remote("local[2]") starts)
    spark = (SparkSession.builder.master("local[2]")
             .config("spark.plugins", "org.apache.spark.sql.connect.SparkConnectPlugin")
             .config("spark.connect.grpc.binding.port", "{port}").getOrCreate())
    while True:
        try:
            socket.create_connection(("localhost", {port}), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    print("serving", flush=True)
    threading.Event().wait()
''')

LOST_SERVER_CLIENT = textwrap.dedent('''
    import sys, os, signal, subprocess, time, threading, glob
    sys.path.insert(0, {root!r})
    import cloudpickle
    from tests import jobs
    cloudpickle.register_pickle_by_value(jobs)
    from pyspark.sql import SparkSession
    from hvd_magics import HorovodJobError, HorovodRunner, HorovodMagicsError
    os.environ["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = "hvd-magics-test"  # the server's too

    def start_server():  # in an environment without the client's Spark Connect settings
        env = {{k: v for k, v in os.environ.items()
               if not k.startswith("SPARK_") or k == "SPARK_CONNECT_AUTHENTICATE_TOKEN"}}
        proc = subprocess.Popen([sys.executable, "-c", {server!r}], stdout=subprocess.PIPE,
                                text=True, start_new_session=True, env=env)
        assert proc.stdout.readline().strip() == "serving"
        return proc

    server = start_server()
    spark = SparkSession.builder.remote("sc://localhost:{port}").getOrCreate()
    print("before", HorovodRunner(np=2).run(jobs.print_lines, count=1), flush=True)
    marks = {marks!r}

    def kill_server():
        while len(glob.glob(marks + "/rank*")) < 2:
            time.sleep(0.05)
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()

    threading.Thread(target=kill_server, daemon=True).start()
    started = time.monotonic()
    try:
        HorovodRunner(np=2).run(jobs.sleep_in_allreduce, pid_dir=marks)
    except HorovodJobError as exc:
        print("lost after", round(time.monotonic() - started), "s:", str(exc).splitlines()[0])
        print("first failure:", exc.failures[0].headline())
    started = time.monotonic()
    try:
        HorovodRunner(np=2).run(jobs.print_lines, count=1)
    except HorovodMagicsError as exc:
        print("while down:", round(time.monotonic() - started), "s:", type(exc).__name__, exc)
    server = start_server()
    try:
        print("same session after restart", HorovodRunner(np=2).run(jobs.print_lines, count=1))
    except HorovodMagicsError as exc:
        print("same session after restart:", type(exc).__name__, str(exc).count(chr(10)), exc)
    spark.stop()  # as the error says
    spark = SparkSession.builder.remote("sc://localhost:{port}").getOrCreate()
    print("new session", HorovodRunner(np=2).run(jobs.print_lines, count=1), flush=True)
    spark.stop()
    os.killpg(server.pid, signal.SIGKILL)
    os._exit(0)  # the first session's client would retry its exit hook for ten minutes
''')


def test_a_connect_server_killed_mid_job_fails_it_in_seconds_naming_the_server(tmp_path):
    """The cell hung for about ten minutes (pyspark retried interruptTag against the dead
    server), then showed a raw SparkConnectGrpcException."""
    from tests.standalone import _free_port

    port = _free_port()
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.run([sys.executable, "-c", LOST_SERVER_CLIENT.format(
        root=str(ROOT), port=port, marks=str(marks),
        server=SERVER_SCRIPT.format(port=port))], env=env, capture_output=True, text=True,
        timeout=400, cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, out[-3000:] + proc.stderr[-3000:]
    assert "before 0" in out
    lost = re.search(r"lost after (\d+) s: (.*)", out)
    assert lost and int(lost.group(1)) < 30, out
    # the error's first line names the server that went, not a rank that went with it (it
    # was "2 of 2 ranks failed; the first was rank 1 ...: RankLost", the server in brackets)
    assert lost.group(2).startswith(f"The Spark Connect server at localhost:{port} does not "
                                    "answer"), lost.group(2)
    assert re.search(r"while down: \d s: SparkSessionLost the Spark Connect server at "
                     rf"localhost:{port} does not answer .*Fix: start the Spark Connect server "
                     r"again if it is down, then get a new session \(spark.stop\(\); spark = "
                     rf"SparkSession.builder.remote\('sc://localhost:{port}'\).getOrCreate\(\)\)",
                     out), out
    restart = re.search(r"same session after restart:? (.*)", out).group(1)
    assert restart == "0" or restart.startswith("SparkSessionLost 0 the Spark Connect session "), \
        restart  # it works, or it says in one line (0 line breaks) how to get a new session
    assert "new session 0" in out
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
