"""Shared fixtures: one SparkSession at a time (local mode, then the standalone cluster)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.standalone import StandaloneCluster

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Every JVM of the suite (sessions here, in kernels and in subprocesses; executors; standalone
# daemons; Connect servers) gets the JVM flags of tests/spark-conf: see spark-defaults.conf there.
os.environ.setdefault("SPARK_CONF_DIR", str(ROOT / "tests" / "spark-conf"))

_state: dict = {"master": None, "cluster": None}

# A suite started in the background by a non-interactive shell (`make test &`, a CI runner)
# inherits SIGINT ignored (POSIX), and Python then installs no KeyboardInterrupt handler: the
# tests that interrupt a job with SIGINT hung for ten minutes. A notebook kernel always has one.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

#: The marker of every test folder (its topology); ``pytest -m fast`` is the quick tier.
TIERS = {"unit": "fast", "driver": "driver", "spark_local": "spark_local",
         "spark_connect": "spark_connect", "spark_cluster": "spark_cluster",
         "spark_elastic": "spark_elastic", "notebooks": "notebook", "browser": "browser",
         "mlflow_tracking": "mlflow", "spark_hosts": "spark_hosts", "wheel": "wheel"}


def _tier_of(path: str) -> str:
    """The tier (the folder under tests/) of a test file's path or node id, or ``"?"``."""
    parts = Path(path).parts
    return parts[parts.index("tests") + 1] if "tests" in parts[:-1] else "?"


#: The tiers whose tests share a server or a SparkSession of this process (one JVM per
#: topology, a Connect server on Spark's default port): under ``make test``'s lanes
#: (``pytest -n 3``) each of them runs whole in one lane, while the other tiers' tests (ranks on
#: the driver, kernels, pure Python) are spread test by test.
ONE_LANE = ("spark_local", "spark_cluster", "spark_connect", "spark_elastic", "mlflow_tracking",
            "browser", "spark_hosts")

# The suite's ranks fork from zygotes of its own run (both lanes, which inherit this variable
# from the process that starts them, and every kernel, Spark worker and Connect server it
# starts share them; another suite running beside it has its own), ended when the suite ends
# (see pytest_sessionfinish).
os.environ.setdefault("HVD_MAGICS_ZYGOTE_DIR", str(
    Path(os.environ.get("TMPDIR", "/tmp")) / f"hvd-tests-zygotes-{os.getpid()}"))
# Most of the suite's environments (an application's executors, a shipped environment) serve a
# few jobs: their zygotes' memory is given back after 5 minutes unused, not 10.
os.environ.setdefault("HVD_MAGICS_ZYGOTE_IDLE_S", "300")


def end_zygotes(folder: str) -> None:
    """End the zygotes serving in ``folder`` (and the ranks they forked, which none should
    still run), and wait for them."""
    import socket
    import struct

    ended = []
    for path in Path(folder).glob("*.sock"):
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            connection.connect(str(path))
            creds = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                          struct.calcsize("3i"))
            pid = struct.unpack("3i", creds)[0]
            os.kill(pid, signal.SIGTERM)
            ended.append(pid)
        except OSError:
            continue
        finally:
            connection.close()
    processes_left(ended)


#: Test files whose tests run one after another in one lane: the zygote tests, one of which
#: marks a module of hvd_magics changed on disk, which retires every zygote of the suite that
#: imported it (another of them, run beside it, found its zygote gone).
ONE_LANE_FILES = ("test_zygote.py",)
#: The unit tests that import TensorFlow in their own process (5 CPU seconds the first time):
#: one lane runs them all, so that ``make test-fast`` imports it once, not in both lanes.
TENSORFLOW_FILES = ("tests/unit/test_step_split_tf.py", "tests/unit/test_gpu_guard.py",
                    "tests/unit/test_predict.py", "tests/unit/test_estimator_imports.py")

# A lane of ``pytest -n`` keeps its own temporary folder (its ranks' and kernels' too), so a
# test that counts what its jobs leave in the temporary folder sees only its own lane's.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import tempfile

    _lane_tmp = Path(tempfile.gettempdir()) / f"hvd-tests-{os.environ['PYTEST_XDIST_WORKER']}"
    _lane_tmp.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(_lane_tmp)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


def pytest_xdist_make_scheduler(config, log):
    """The lanes of ``pytest -n``: a tier of :data:`ONE_LANE` is one unit of work, every other
    test a unit of its own, the largest units first. (xdist's own ``loadgroup`` renames node
    ids to group them, which pytest 9.2 no longer lets it do: its groups were silently split.)"""
    from xdist.scheduler import LoadScopeScheduling

    class TierLanes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            tier = _tier_of(path)
            if tier in ONE_LANE:
                return tier
            if path.endswith(TENSORFLOW_FILES):
                return "tensorflow"
            return path if path.endswith(ONE_LANE_FILES) else nodeid

    return TierLanes(config, log)


#: Unit tests whose time is importing TensorFlow in their process (5 CPU seconds) or waiting on
#: purpose (a start timeout run out, a slow host's answers): the whole suite runs them, the quick
#: tier (``make test-fast``, at most 30 s) leaves them out.
SLOW_UNIT_TESTS = (
    "tests/unit/test_step_split_tf.py::",
    "tests/unit/test_gpu_guard.py::test_tensorflow_imported_but_not_initialised_is_not_a_holder",
    "tests/unit/test_shard.py::test_torch_and_tensorflow_loaders_give_the_same_steps",
    "tests/unit/test_predict.py::test_a_keras_loss_from_logits_means_softmax",
    "tests/unit/test_link_probe.py::test_the_probe_times_each_host_one_way_then_the_other",
    "tests/unit/test_start_clock.py::test_the_start_timeout_does_not_count_the_unpacking",
    "tests/unit/test_kept_steps.py::test_a_copy_killed_half_way_leaves_the_step_before_it_whole",
)


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ARG001 - pytest's hook
    """Mark each test by the folder it is in (a test folder without a tier is an error)."""
    for item in items:
        folder = _tier_of(str(item.fspath))
        if folder not in TIERS:
            raise pytest.UsageError(f"tests/{folder} has no tier: add it to TIERS in "
                                    "tests/conftest.py and to the markers in pyproject.toml")
        slow = folder == "unit" and item.nodeid.startswith(SLOW_UNIT_TESTS)
        item.add_marker("unit_slow" if slow else TIERS[folder])


def _cpu_seconds() -> tuple[float, float]:
    """``(busy, all)`` CPU seconds of the whole machine since boot, from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [float(v) for v in stat.readline().split()[1:]]
    ticks = os.sysconf("SC_CLK_TCK")
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
    return (sum(fields) - idle) / ticks, sum(fields) / ticks


_TIMES: dict = {"tiers": {}, "tests": {}, "tier_cpu": {}, "test_cpu": {}, "began": None,
                "cpu": None}
#: Where the run writes each test's time (setup, call and teardown), longest first: what a
#: change to the suite's length starts from (the report shows the 25 longest only).
TEST_TIMES = Path(os.environ.get("TMPDIR", "/tmp")) / "hvd-magics-test-times.tsv"


def _repository_entries() -> set[str] | None:
    """What ``git status`` lists in the repository besides its tracked, unchanged files (new
    files and folders, ignored ones included; Python's caches left out), or ``None`` outside a
    git checkout."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--ignored",
                              "--untracked-files=normal"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return {line[3:] for line in out.stdout.splitlines()
            if line[:2] in ("??", "!!") and "__pycache__" not in line
            and ".pytest_cache" not in line}


def pytest_sessionstart(session) -> None:  # noqa: ARG001 - pytest's hook
    _TIMES["began"], _TIMES["cpu"] = time.monotonic(), _cpu_seconds()
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        _TIMES["entries"] = _repository_entries()


def pytest_sessionfinish(session) -> None:
    """End the suite's zygotes once every lane is done (in the process that started the lanes);
    fail the run when its tests wrote into the repository (a Lightning run's
    ``lightning_logs/`` was committed once): tests write under temporary folders only."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        end_zygotes(os.environ["HVD_MAGICS_ZYGOTE_DIR"])
        shutil.rmtree(os.environ["HVD_MAGICS_ZYGOTE_DIR"], ignore_errors=True)
        before, after = _TIMES.get("entries"), _repository_entries()
        written = sorted(after - before) if before is not None and after is not None else []
        if written:
            print(f"\nthe tests wrote into the repository (write under tmp_path instead): "
                  f"{', '.join(written)}", file=sys.stderr)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # noqa: ARG001 - pytest's hook
    """Add the machine's busy CPU seconds over each test (setup to teardown: its ranks, JVMs and
    kernels included) to its tier, so the report says where the suite's work is, not only its
    waits."""
    before = _cpu_seconds()[0]
    yield
    used = _cpu_seconds()[0] - before
    tier = _tier_of(str(item.fspath))
    _TIMES["tier_cpu"][tier] = _TIMES["tier_cpu"].get(tier, 0.0) + used
    _TIMES["test_cpu"][item.nodeid] = used


def pytest_runtest_logreport(report) -> None:
    """Add each test's setup, call and teardown time to its tier (its folder)."""
    folder = _tier_of(str(report.fspath))
    _TIMES["tiers"][folder] = _TIMES["tiers"].get(folder, 0.0) + report.duration
    _TIMES["tests"][report.nodeid] = _TIMES["tests"].get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    """The time of each tier and how busy the machine's cores were over the run, so a slower
    suite shows where it got slower."""
    if _TIMES["began"] is None or not _TIMES["tiers"]:
        return
    wall = time.monotonic() - _TIMES["began"]
    busy_before, all_before = _TIMES["cpu"]
    busy, everything = _cpu_seconds()
    share = (busy - busy_before) / max(everything - all_before, 1e-9)
    terminalreporter.section("time per tier")
    # in lanes (pytest -n) the tests run in the workers: their CPU is not this process's to
    # measure, and the machine's CPU over one test is shared with the other lane's
    measured = bool(_TIMES["tier_cpu"])
    terminalreporter.write_line(f"{'tier':<16} {'time':>10}" + (f" {'busy CPU':>10}" if measured
                                                                else " (summed over the lanes)"))
    for folder, seconds in sorted(_TIMES["tiers"].items(), key=lambda kv: -kv[1]):
        cpu = f" {_TIMES['tier_cpu'].get(folder, 0.0):8.1f} s" if measured else ""
        terminalreporter.write_line(f"{folder:<16} {seconds:8.1f} s{cpu}")
    costly = sorted(_TIMES["test_cpu"].items(), key=lambda kv: -kv[1])[:15]
    if costly:
        terminalreporter.write_line("the 15 tests that kept the cores busiest (CPU seconds):")
        for nodeid, cpu in costly:
            terminalreporter.write_line(f"{cpu:8.1f} s  {nodeid}")
    terminalreporter.write_line(f"{'all':<16} {wall:8.1f} s wall; the {os.cpu_count()} cores "
                                f"were {share:.0%} busy (the whole machine, from /proc/stat)")
    try:
        TEST_TIMES.write_text("".join(
            f"{seconds:.1f}\t{_tier_of(nodeid.split('::')[0])}\t{nodeid}\n" for nodeid, seconds in
            sorted(_TIMES["tests"].items(), key=lambda kv: -kv[1])))
        terminalreporter.write_line(f"every test's time: {TEST_TIMES}")
    except OSError as exc:
        terminalreporter.write_line(f"every test's time was not written: {exc}")


def _stop_active() -> None:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    elif SparkContext._active_spark_context is not None:  # a context no longer this thread's
        SparkContext._active_spark_context.stop()
    _state["master"] = None


def _forget_settings(keys) -> None:
    """Clear the ``spark.*`` settings an earlier session of this process was built with: the
    builder makes them JVM system properties, which outlive the session and would otherwise be
    the next session's defaults (a GPU amount per task, a core limit)."""
    from pyspark import SparkContext

    jvm = SparkContext._jvm
    if jvm is not None:
        for key in keys:
            jvm.java.lang.System.clearProperty(key)


def _session(master: str, **conf: str):
    """The one SparkSession of the tests on ``master`` with ``conf``: the running one when it
    is that, else a new one (the other stopped first)."""
    from pyspark.sql import SparkSession

    wanted = (master, tuple(sorted(conf.items())))
    # the session itself is asked too: in one fresh-clone run a lane's session was no longer
    # this thread's active one though the record said it ran (6 tests got None)
    if _state["master"] != wanted or SparkSession.getActiveSession() is None:
        _stop_active()
        _forget_settings(_state.get("keys", ()))
        settings = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
                    "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                    **conf}
        builder = SparkSession.builder.master(master).appName("hvd_magics-tests")
        for key, value in settings.items():
            builder = builder.config(key, value)
        _state["keys"] = ("spark.master", "spark.app.name", *settings)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        _state["master"] = wanted
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


@pytest.fixture()
def local_spark():
    """A local[2] SparkSession (started once, reused)."""
    return _session("local[2]")


@pytest.fixture(scope="session")
def standalone_cluster():
    """Start the cluster once for the session; stop it (and its JVMs) at the end."""
    # two workers of two cores and two simulated GPUs each (tests/fake_gpus.sh): the tier's
    # sessions take a core of each, the several-ranks-per-task tests both, with the GPUs
    cluster = StandaloneCluster(workers=2, cores=2, worker_opts=(
        "-Dspark.decommission.enabled=true "  # a SIGPWR decommissions it (a spot instance's end)
        f"-Dspark.worker.resource.gpu.amount=2 "
        f"-Dspark.worker.resource.gpu.discoveryScript={FAKE_GPUS}"))
    _state["cluster"] = cluster
    yield cluster
    _stop_active()
    cluster.stop()


@pytest.fixture(scope="session")
def host_cluster():
    """Two real hosts of two cores (network namespaces: tests/hosts.py), each with a second
    network on which they cannot reach each other, and each resolving its own name to that
    network's address, the first to Debian's ``127.0.1.1``; removed at the end."""
    from tests.hosts import HostCluster

    cluster = HostCluster(hosts=2, cores=2, debian=(0,), second_network=True)
    _state["hosts"] = cluster
    yield cluster
    _stop_active()
    cluster.stop()
    assert cluster.left() == []


def hosts_session(cluster, wait_s: float = 60):
    """The tests' SparkSession on ``cluster``'s hosts (tests/hosts.py), its driver on their
    bridge, once an executor of each host registered."""
    spark = _session(cluster.url, **cluster.session_conf())
    deadline = time.monotonic() + wait_s
    while spark.sparkContext._jsc.sc().getExecutorIds().size() < len(cluster.hosts):
        assert time.monotonic() < deadline, "the hosts' executors did not register"
        time.sleep(0.2)
    return spark


@pytest.fixture()
def hosts_spark(host_cluster):
    """A SparkSession whose driver is on the hosts' bridge, with an executor on each host."""
    return hosts_session(host_cluster)


#: A GPU discovery script that finds two GPUs (there are none here), as pyspark's tests use.
FAKE_GPUS = Path(__file__).parent / "fake_gpus.sh"


@pytest.fixture()
def gpu_cluster_spark(standalone_cluster):
    """A SparkSession on the standalone cluster with two 2-core executors that hold two
    (simulated) GPUs each, and two GPUs per task."""
    spark = _session(standalone_cluster.url, **{
        "spark.executor.cores": "2", "spark.executor.memory": "1g", "spark.cores.max": "4",
        "spark.executor.resource.gpu.amount": "2",
        "spark.executor.resource.gpu.discoveryScript": str(FAKE_GPUS),
        "spark.task.resource.gpu.amount": "2"})
    deadline = time.monotonic() + 60
    while spark.sparkContext._jsc.sc().getExecutorIds().size() < 2:
        if time.monotonic() > deadline:
            raise RuntimeError("standalone cluster: executors did not register within 60 s")
        time.sleep(0.25)
    return spark


@pytest.fixture()
def cluster_spark(standalone_cluster):
    """A SparkSession on the standalone cluster, with both executors registered."""
    from hvd_magics.launch.spark_slots import task_slots

    spark = _session(standalone_cluster.url, **{"spark.executor.cores": "1",
                                                "spark.executor.memory": "1g",
                                                "spark.cores.max": "2"})
    deadline = time.monotonic() + 60
    while task_slots(spark.sparkContext)[1] < 2:
        if time.monotonic() > deadline:
            raise RuntimeError("standalone cluster: executors did not register within 60 s")
        time.sleep(0.25)
    return spark


def interrupt_once_marked(folder, ranks=(0, 1), limit: float = 60) -> None:
    """In a thread: send this process SIGINT (the notebook's interrupt) once every rank in
    ``ranks`` has left a file named by its rank in ``folder`` (nothing after ``limit`` s)."""
    import threading

    def interrupt() -> None:
        deadline = time.monotonic() + limit
        while not all((Path(folder) / str(r)).exists() for r in ranks):
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()


def active_spark_jobs(spark, limit: float = 10) -> list[int]:
    """The Spark jobs still active, once the status store has heard of the ones that ended:
    it hears through Spark's listener bus, a moment after ``collect()`` returned or a job group
    was cancelled (seconds on a loaded machine), so wait for that (bounded), not for a job."""
    tracker = spark.sparkContext.statusTracker()
    deadline = time.monotonic() + limit
    while tracker.getActiveJobsIds() and time.monotonic() < deadline:
        time.sleep(0.05)
    return list(tracker.getActiveJobsIds())


def rank_processes_alive(pids) -> list[int]:
    """The pids (of ranks) that still run (one that ends while it is looked at does not)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def processes_left(pids, within: float = 10.0) -> list[int]:
    """The pids still running once ``within`` seconds have passed or none is left (a process
    sent SIGKILL ends a moment later, not at once)."""
    deadline = time.monotonic() + within
    while rank_processes_alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return rank_processes_alive(pids)


def supervisor_of(pid: int):
    """The process that started rank process ``pid`` (a psutil.Process): its keeper's parent
    for a rank started fresh; for one forked from a zygote (not a descendant of it), the process
    holding the other ends of the rank's pipes."""
    import psutil

    from hvd_magics.protocol import ZYGOTE_MODULE

    rank = psutil.Process(pid)
    above = rank.parents()
    if len(above) < 2 or ZYGOTE_MODULE not in " ".join(above[1].cmdline()):
        return above[1]

    def pipes(of: int) -> set[str]:
        found = set()
        for fd in os.listdir(f"/proc/{of}/fd"):
            try:
                target = os.readlink(f"/proc/{of}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("pipe:"):
                found.add(target)
        return found

    mine = pipes(pid)
    family = {pid, *(process.pid for process in rank.children(recursive=True))}
    for process in psutil.process_iter():
        try:
            if (process.pid not in family and pipes(process.pid) & mine
                    and ZYGOTE_MODULE not in " ".join(process.cmdline())):  # nor its keeper
                return process
        except (OSError, psutil.Error):
            continue
    raise AssertionError(f"no process holds the pipes of rank process {pid}")


import cloudpickle  # noqa: E402

from tests import engine_jobs, estimator_models, jobs  # noqa: E402

cloudpickle.register_pickle_by_value(jobs)
cloudpickle.register_pickle_by_value(engine_jobs)
cloudpickle.register_pickle_by_value(estimator_models)


@pytest.fixture(scope="session")
def ip():
    """A real IPython shell with hvd_magics loaded."""
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "hvd_magics")
    return shell


@pytest.fixture(autouse=True)
def fresh_session():
    """Every test starts as a fresh kernel would (no last run, timeline off) and a test that fails
    halfway cannot leave the timeline switched on for the next one."""
    from hvd_magics.job.session import SESSION

    SESSION.reset()
    yield
    SESSION.reset()
