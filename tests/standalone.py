"""A real Spark standalone cluster on loopback (a master and one-core workers), for the tests
that need one and for the benchmarks."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil


def wait_for_master(url: str, ready, what: str, logs: Path, timeout: float = 90) -> None:
    """Poll a standalone master's JSON state at ``url`` until ``ready(state)``; raise naming
    ``what`` and the ``logs`` folder after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if ready(json.load(response)):
                    return
        except (OSError, ValueError):  # not up yet; or up, its JSON not yet written
            pass
        time.sleep(0.3)
    raise RuntimeError(f"standalone cluster: timed out waiting for {what}; logs in {logs}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StandaloneCluster:
    """A real Spark standalone master and ``workers`` workers of ``cores`` cores each on
    loopback."""

    def __init__(self, workers: int = 2, cores: int = 1, worker_opts: str = "") -> None:
        self.cores = cores
        #: The workers' ``SPARK_WORKER_OPTS`` (their GPU resources, say).
        self.worker_opts = worker_opts
        import pyspark

        spark_home = os.path.dirname(pyspark.__file__)
        self.env = {**os.environ, "SPARK_HOME": spark_home, "SPARK_LOCAL_IP": "127.0.0.1",
                    "PYSPARK_PYTHON": sys.executable}
        spark_class = os.path.join(spark_home, "bin", "spark-class")
        self.port, self.ui_port = _free_port(), _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"hvd-cluster-{self.port}"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # the executors' folders (and what Spark unpacks there) beside the logs, not in SPARK_HOME
        # (pyspark's folder in the virtual environment, which ship_environment() would pack)
        self.env["SPARK_WORKER_DIR"] = str(self.log_dir / "work")
        self.procs = [self._start(spark_class, "master", "org.apache.spark.deploy.master.Master",
                                  "--host", "127.0.0.1", "--port", str(self.port),
                                  "--webui-port", str(self.ui_port))]
        self._wait(lambda s: True, "the master's web UI")
        self._spark_class = spark_class
        for _ in range(workers):
            self.add_worker(wait=False)
        self.wait_for_workers(workers)

    def session(self, app: str):
        """A quiet SparkSession on this cluster with one one-core executor per worker (for the
        benchmarks; the tests' fixture also waits for the executors)."""
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.master(self.url).appName(app)
                 .config("spark.executor.cores", "1")
                 .config("spark.cores.max", str(len(self.procs) - 1))
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.host", "127.0.0.1").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        return spark

    def add_worker(self, wait: bool = True) -> subprocess.Popen:
        """Start one more worker (and wait until the master has it)."""
        alive = self.alive_workers()
        env = {**self.env, **({"SPARK_WORKER_OPTS": self.worker_opts} if self.worker_opts
                              else {})}
        proc = self._start(self._spark_class, f"worker{len(self.procs) - 1}",
                           "org.apache.spark.deploy.worker.Worker", self.url, "--cores",
                           str(self.cores), "--memory", "2g", "--host", "127.0.0.1",
                           "--webui-port", str(_free_port()), env=env)
        self.procs.append(proc)
        if wait:
            self.wait_for_workers(alive + 1)
        return proc

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                return sum(w["state"] == "ALIVE" for w in json.load(r)["workers"])
        except OSError:
            return 0

    def wait_for_workers(self, count: int) -> None:
        self._wait(lambda s: sum(w["state"] == "ALIVE" for w in s["workers"]) >= count,
                   f"{count} workers to register")

    def _start(self, spark_class: str, name: str, *args: str,
               env: dict[str, str] | None = None) -> subprocess.Popen:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115
        return subprocess.Popen([spark_class, *args], env=env or self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)

    def _wait(self, ready, what: str, timeout: float = 90) -> None:
        wait_for_master(f"http://127.0.0.1:{self.ui_port}/json/", ready, what, self.log_dir,
                        timeout)

    def stop(self) -> None:
        for proc in self.procs:
            try:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
            except psutil.Error:
                pass
            proc.kill()
            proc.wait()
