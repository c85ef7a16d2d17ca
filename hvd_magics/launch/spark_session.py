"""The SparkSession a job runs on: the active one (classic or Spark Connect), an embedded local
one started for the user, a Connect server that went away (refused at once, never after
pyspark's ten minutes of retries), and whether the executors can reach this notebook."""
from __future__ import annotations

import contextlib
import os
import re
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any
from collections.abc import Iterator

from hvd_magics.errors import SparkSessionLost
from hvd_magics.launch.spark_log import cancel_quietly
from hvd_magics.protocol import (ENV_DRIVER_HOST, ENV_LIVE, ENV_PYSPARK_DRIVER_PYTHON,
                                 ENV_PYSPARK_PYTHON)
from hvd_magics.task.slots import local_addresses


#: How long a Spark Connect server may take to accept a connection before it counts as gone.
CONNECT_PROBE_S = 2.0


def active_session() -> Any | None:
    """The active SparkSession, or ``None`` (never starts one)."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        return None
    session = SparkSession.getActiveSession()
    if session is None:  # the active session is per thread: another thread's (a background
        # job's) finds the one the notebook made as the process's default
        default = getattr(SparkSession, "_instantiatedSession", None)
        if default is not None and getattr(default.sparkContext, "_jsc", None) is not None:
            return default
    if session is None:  # a Connect session made after its server restarted is only the default
        try:
            from pyspark.sql.connect.session import SparkSession as ConnectSession

            session = ConnectSession._get_default_session()  # noqa: SLF001
        except Exception:  # noqa: BLE001 - no Connect client installed
            return None
    return session


def connect_endpoint(spark: Any) -> tuple[str, int] | None:
    """``(host, port)`` of a Spark Connect session's server, or ``None`` when unknown."""
    try:
        host, port = spark.client._builder.endpoint.rsplit(":", 1)  # noqa: SLF001
        return host.strip("[]"), int(port)
    except Exception:  # noqa: BLE001 - pyspark's internals; unknown means not checked
        return None


def connect_server_gone(spark: Any) -> str | None:
    """Why a Spark Connect session's server is gone (it accepts no connection), or ``None``.

    pyspark's own calls retry an absent server for about ten minutes; this answers at once.
    """
    endpoint = connect_endpoint(spark)
    if endpoint is None:
        return None
    try:
        with socket.create_connection(endpoint, timeout=CONNECT_PROBE_S):
            return None
    except OSError as exc:
        return (f"the Spark Connect server at {endpoint[0]}:{endpoint[1]} does not answer "
                f"({exc.strerror or type(exc).__name__}): it was stopped or lost")


#: Connect sessions whose server went away, kept for the kernel's life: pyspark closes a
#: session's gRPC channel when the session is garbage-collected, and doing that at an arbitrary
#: point of another thread's gRPC call (our stage's, still retrying) was seen to deadlock the
#: notebook when it rebound ``spark`` to a new session.
_GONE_SESSIONS: list[Any] = []


def give_up_retries(spark: Any) -> None:
    """Let the calls of a Connect session whose server is gone fail at their next retry
    instead of retrying for ten minutes (the job's own stage among them)."""
    if not any(spark is kept for kept in _GONE_SESSIONS):
        _GONE_SESSIONS.append(spark)
    try:
        spark.client._retry_policies[:] = []  # noqa: SLF001 - the list each call's retry reads
    except Exception:  # noqa: BLE001,S110 - pyspark's internals changed: pyspark retries
        pass


def session_lost(spark: Any, why: str) -> SparkSessionLost:
    """The error for a Connect session that cannot be used, with how to get a new one (pyspark's
    ``getOrCreate`` gives the old session back until it is stopped)."""
    endpoint = connect_endpoint(spark)
    url = f"sc://{endpoint[0]}:{endpoint[1]}" if endpoint else "..."
    return SparkSessionLost(
        f"{why}. Fix: start the Spark Connect server again if it is down, then get a new "
        f"session (spark.stop(); spark = SparkSession.builder.remote({url!r}).getOrCreate()) "
        "and run the cell again.")


def _gist(exc: BaseException) -> str:
    """The telling line of a pyspark or gRPC error (a gRPC error's ``details``)."""
    text = str(exc).strip()
    found = re.search(r'details = "([^"]+)"', text)
    if found:
        return found.group(1)[:300]
    return text.splitlines()[0][:300] if text else type(exc).__name__


def check_connect_session(spark: Any) -> str:
    """The master of a Connect session, asked of its server: refused at once (never pyspark's
    ten minutes of retries) when the server is gone, or when it no longer knows the session
    (it was restarted).

    Raises
    ------
    SparkSessionLost
        Naming the server and the fix.
    """
    gone = connect_server_gone(spark)
    if gone:
        give_up_retries(spark)
        raise session_lost(spark, gone)
    try:
        return spark.conf.get("spark.master", "?")
    except Exception as exc:  # noqa: BLE001 - pyspark's Connect errors have no common base here
        give_up_retries(spark)
        raise session_lost(spark, f"the Spark Connect session cannot be used ({_gist(exc)})"
                           ) from None


def cancel_running_jobs(sc: Any, group: str) -> None:
    """Cancel the Spark jobs of job group ``group`` that run now, one by one.

    Not ``cancelJobGroup``: Spark writes ``WARN DAGScheduler: Failed to cancel job group ...
    Cannot find active jobs for it`` into the cell when the group's job ended in the meantime
    (the status tracker, a listener, still calls it running a moment after). A job cancelled by
    its id after it ended is passed over quietly.
    Spark's warning of each task the cancel kills is kept out of the cell
    (:func:`~hvd_magics.launch.spark_log.cancel_quietly`).
    """
    tracker = sc.statusTracker()
    running = [spark_job for spark_job in tracker.getJobIdsForGroup(group)
               if getattr(tracker.getJobInfo(spark_job), "status", None) == "RUNNING"]
    if running:
        cancel_quietly(sc, running)


def embedded_spark_log() -> Path:
    """Where the JVM of an embedded SparkSession writes its own output."""
    return Path(tempfile.gettempdir()) / "hvd_magics" / f"spark-driver-{os.getpid()}.log"


def start_local_session(np: int) -> Any:
    """Start an embedded local-mode SparkSession sized for ``np`` ranks (or the machine's cores)
    and one task more (a warm pool of them deals DataFrames through it); say so in one line.

    The JVM's own output (log4j, JVM warnings) goes to :func:`embedded_spark_log`, not the cell.
    """
    try:
        from pyspark import SparkConf, SparkContext
        from pyspark.java_gateway import launch_gateway
        from pyspark.sql import SparkSession
    except ImportError as exc:
        raise ImportError("np > 0 runs ranks as Spark tasks and needs pyspark: "
                          "pip install 'pyspark>=4' (or use np < 0 to run on the driver "
                          "only)") from exc
    # Spark's Python workers must use this interpreter, which has horovod and hvd_magics.
    os.environ.setdefault(ENV_PYSPARK_PYTHON, sys.executable)
    os.environ.setdefault(ENV_PYSPARK_DRIVER_PYTHON, sys.executable)
    # one slot beyond the ranks: a warm pool of all of them still has one to deal DataFrames
    cores = max(np, os.cpu_count() or 1) + 1
    settings = {"spark.master": f"local[{cores}]", "spark.app.name": "hvd_magics",
                "spark.ui.showConsoleProgress": "false", "spark.driver.host": "127.0.0.1",
                "spark.driver.bindAddress": "127.0.0.1"}
    log = embedded_spark_log()
    if SparkContext._gateway is None:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:  # the JVM keeps its own copy of the descriptor
            gateway = launch_gateway(SparkConf().setAll(settings.items()),
                                     popen_kwargs={"stdout": out, "stderr": out})
        SparkContext._ensure_initialized(gateway=gateway)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")  # our own session: keep Spark's chatter out of cells
    print(f"hvd_magics: no active SparkSession; started an embedded local[{cores}] one "
          f"(its log: {log}).", file=sys.stderr)
    return spark


def is_local(sc: Any) -> bool:
    """Whether the executors of ``sc`` run on this machine (``local``, ``local-cluster``)."""
    return str(sc.master).startswith("local")


@contextlib.contextmanager
def local_workers_use_this_python(sc: Any, python: str | None = None) -> Iterator[None]:
    """Python functions wrapped inside this block run in this very interpreter (which has
    hvd_magics) when the executors run on this machine, or in ``python`` when given (the
    shipped environment's interpreter on a cluster's executors).

    A local master's session started without ``PYSPARK_PYTHON`` would otherwise give them the
    system's ``python3``. On a cluster the session's own choice stands unless ``python`` says
    otherwise; a Connect session (``sc`` is ``None``) chooses on its server.
    """
    if sc is None or not (python or is_local(sc)):
        yield
        return
    saved = sc.pythonExec
    sc.pythonExec = python or sys.executable
    try:
        yield
    finally:
        sc.pythonExec = saved


def executors_run_this_python(spark: Any) -> bool:
    """Whether ``spark``'s executors run this very Python (a classic session's local master):
    nothing needs sending to them."""
    return not is_connect(spark) and is_local(spark.sparkContext)


#: The files this process added to each session: ``(session, what was sent)``.
_SENT: set[tuple[str, str]] = set()


def session_key(spark: Any) -> str:
    """``spark``'s Spark application (a Connect session's own id)."""
    if is_connect(spark):
        return f"connect:{spark.session_id}"
    return f"classic:{spark.sparkContext.applicationId}"


def send_once(spark: Any, path: str, kind: str) -> bool:
    """Add ``path`` to the files of ``spark``'s executors (``kind``: ``"pyfile"``, put on their
    Python path, or ``"archive"``, unpacked, its ``#alias`` fragment naming the folder) unless
    this process did before for this application; whether it was sent now."""
    sent = (session_key(spark), path)
    if sent in _SENT:
        return False
    if is_connect(spark):
        spark.addArtifacts(path, **{kind: True})
    elif kind == "pyfile":
        spark.sparkContext.addPyFile(path)
    else:
        spark.sparkContext.addArchive(path)
    _SENT.add(sent)
    return True


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext, no RDDs)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def driver_address(spark: Any) -> str:
    """The notebook's address as executors reach it: ``HVD_MAGICS_DRIVER_HOST`` when set, else
    the session's driver host (the notebook's own, for a classic session)."""
    host = (os.environ.get(ENV_DRIVER_HOST) or spark.conf.get("spark.driver.host", None)
            or socket.gethostname())
    return socket.gethostbyname(host)


def connect_server_host(spark: Any) -> str | None:
    """The host of a Spark Connect session's server (``None`` for a classic session)."""
    client = getattr(spark, "_client", None)
    return getattr(client, "host", None) if client is not None else None


def no_live_view_reason(spark: Any) -> str | None:
    """Why the executors cannot send the job's events to this notebook as they happen, or
    ``None`` when they can."""
    if os.environ.get(ENV_LIVE, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"{ENV_LIVE}=0 is set"
    host = connect_server_host(spark) if is_connect(spark) else None
    if host is not None and not os.environ.get(ENV_DRIVER_HOST):
        try:
            address = socket.gethostbyname(host)
        except OSError:
            address = host
        if host not in local_addresses() and address not in local_addresses() \
                and not address.startswith("127."):
            return (f"the Spark Connect server {host} runs the executors on machines that "
                    f"cannot be assumed to reach this notebook (set {ENV_DRIVER_HOST} to an "
                    "address of this machine that they reach for a live view)")
    return None

