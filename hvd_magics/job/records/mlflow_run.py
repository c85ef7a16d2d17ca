"""Record a job in one MLflow run, from the driver: no credentials or code on the executors.

Everything the driver already knows goes in: the job's settings as params, each epoch's metrics
averaged over ranks (``step`` = epoch) with its wall time and samples per second, the ranks' log,
the epoch table, the cell's (or function's) source and the Horovod Timeline as artifacts, and
the end as the run's status (``FINISHED``, ``FAILED`` with the error as a tag, ``KILLED``).

Every MLflow call runs in one background thread, so a slow or absent tracking server never slows
or stops the job. A tracking server that stops answering after the run was created (checked
before every call, so MLflow's own retries do not hold the job) gives one warning; what was
still to write (metrics, artifacts, the run's end) is kept and written when the server answers
again: retried in the background every ``RETRY_S`` and first thing at the next tracked job, so
the run does not stay ``RUNNING``. The run record's summary says so.
"""
from __future__ import annotations

import contextlib
import csv
import io
import os
import queue
import sys
import threading
import time
import urllib.request
import warnings
from dataclasses import dataclass
from importlib import metadata
from typing import Any
from collections.abc import Callable, Iterator

from hvd_magics.errors import MlflowMissing
from hvd_magics.events import EpochEndEvent, Wire
from hvd_magics.protocol import ENV_MLFLOW_RETRY_S, EPOCH_BEGIN, EPOCH_END, TRACKER, is_event

#: How to get MLflow when a job asks for tracking without it.
INSTALL_HINT = ("MLflow tracking needs the mlflow package in the notebook's Python: "
                "pip install 'hvd_magics[mlflow]' (or pip install mlflow)")
#: How long the end of a job waits for MLflow to take what is left before it goes on (a server
#: that does not answer: the writes left are tried again later)...
FINISH_WAIT_S = 20.0
#: ...and for a store in this process (``sqlite:``, ``file:``, a folder: no server to wait for,
#: MLflow itself at work: a first run making its database's tables took more than 20 s on a
#: slow 2-core machine, and the run was left without its id).
LOCAL_FINISH_WAIT_S = 300.0
#: How long a tracking server has to answer its health check.
HEALTH_TIMEOUT_S = 3.0
#: How often the writes a job left pending are tried again while the server does not answer
#: (``HVD_MAGICS_MLFLOW_RETRY_S`` sets it)...
RETRY_S = 10.0
#: ...and for how long after the job.
RETRY_FOR_S = 24 * 3600.0
#: Packages whose versions (on the driver) are logged as params.
VERSIONED = ("horovod", "tensorflow", "tensorflow-cpu", "tf-keras", "keras", "torch", "pyspark")
#: MLflow's own switch for the run links it prints when a run ends.
_SUPPRESS_URL = "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"
#: Run status for each way a job ends.
STATUS = {"succeeded": "FINISHED", "failed": "FAILED", "interrupted": "KILLED",
          "preempted": "KILLED"}


def local_store(tracking_uri: str) -> bool:
    """Whether ``tracking_uri`` is a store MLflow writes from this process (a database file,
    a folder), not a server."""
    if tracking_uri.lower().startswith("databricks"):  # "databricks", "databricks://profile"
        return False
    scheme = tracking_uri.split(":", 1)[0].lower() if ":" in tracking_uri else ""
    return scheme in ("", "file", "sqlite") or len(scheme) == 1  # a Windows drive: a folder


def retry_s() -> float:
    """How often pending writes are tried again: ``HVD_MAGICS_MLFLOW_RETRY_S``, else
    :data:`RETRY_S`."""
    try:
        return max(float(os.environ.get(ENV_MLFLOW_RETRY_S, RETRY_S)), 0.1)
    except ValueError:
        return RETRY_S



@dataclass
class MlflowSettings:
    """Tracking as the user asked for it: ``experiment`` by name, or the current one."""

    experiment: str | None = None

    def __str__(self) -> str:
        where = f"experiment {self.experiment!r}" if self.experiment else "the current experiment"
        return f"MLflow tracking is on: every %%horovod run is recorded in {where}"


def _require_mlflow() -> Any:
    try:
        import mlflow
    except ImportError:
        raise MlflowMissing(INSTALL_HINT) from None
    return mlflow


def requested(asked: bool | str | None, session: MlflowSettings | None) -> MlflowSettings | None:
    """Whether (and where) to track a job.

    ``asked``: ``False`` never; ``True`` or an experiment name always; ``None`` when the session
    turned tracking on, or when the notebook has an active MLflow run.

    Raises
    ------
    MlflowMissing
        When tracking is asked for and mlflow is not installed.
    """
    if asked is False:
        return None
    if asked is None:
        if session is not None:
            _require_mlflow()
            return session
        mlflow = sys.modules.get("mlflow")
        active = getattr(mlflow, "active_run", None)
        return MlflowSettings() if active is not None and active() is not None else None
    _require_mlflow()
    return MlflowSettings(asked if isinstance(asked, str) and asked else None)


def _versions() -> dict[str, str]:
    found = {}
    for name in VERSIONED:
        try:
            found[f"{name}_version"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def ui_url(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """The run's page in the MLflow UI, when the tracking URI is a server."""
    if not tracking_uri.startswith(("http://", "https://")):
        return None
    return f"{tracking_uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def check_health(tracking_uri: str) -> None:
    """Raise at once (``OSError``) when a tracking server does not answer its health check
    (MLflow's own calls would retry for minutes); other stores are not checked."""
    if tracking_uri.startswith(("http://", "https://")):
        health = f"{tracking_uri.rstrip('/')}/health"
        with urllib.request.urlopen(health, timeout=HEALTH_TIMEOUT_S):  # noqa: S310
            pass


class PendingWrites:
    """The MLflow writes of finished jobs that their tracking server did not take, written
    when it answers again (from a background thread, and at the next tracked job)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: list[tuple[str, str, list[Callable[[], None]], Any]] = []
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._flushing = threading.Lock()  # one writer at a time: no write twice

    def add(self, tracking_uri: str, run_id: str, tasks: list[Callable[[], None]],
            record: Any) -> None:
        """Keep ``tasks`` (in order) for ``run_id``; ``record.mlflow`` is updated when done."""
        with self._lock:
            self._runs.append((tracking_uri, run_id, list(tasks), record))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._retry, name="hvd-mlflow-retry",
                                                daemon=True)
                self._thread.start()

    def pending(self, run_id: str) -> int:
        """How many writes of ``run_id`` wait."""
        with self._lock:
            return sum(len(tasks) for _, rid, tasks, _ in self._runs if rid == run_id)

    def flush(self, tracking_uri: str | None = None) -> None:
        """Write what waits (for ``tracking_uri``, or every server) if its server answers."""
        with self._flushing:
            self._flush(tracking_uri)

    def _flush(self, tracking_uri: str | None) -> None:
        with self._lock:
            runs = [r for r in self._runs if tracking_uri in (None, r[0])]
        for uri, run_id, tasks, record in runs:
            try:
                check_health(uri)
                while tasks:
                    tasks[0]()
                    tasks.pop(0)
            except Exception:  # noqa: BLE001,S112 - still not answering: later
                continue
            with self._lock:
                self._runs = [r for r in self._runs if r[1] != run_id]
            if record is not None and getattr(record, "mlflow", None):
                record.mlflow = record.mlflow.split("; incomplete:")[0] + (
                    f"; completed at {time.strftime('%H:%M:%S')}, when the server answered again")

    def _retry(self) -> None:
        deadline = time.monotonic() + RETRY_FOR_S
        every = retry_s()
        while time.monotonic() < deadline:
            self._wake.wait(every)
            self._wake.clear()
            self.flush()
            with self._lock:
                if not self._runs:
                    return


#: The one backlog of the notebook's process.
PENDING = PendingWrites()


class MlflowTracker:
    """Record one job in an MLflow run (a :class:`hvd_magics.job.job_state.JobView` too).

    Parameters
    ----------
    settings : MlflowSettings
        Which experiment.
    job_id, np, where : str, int, str
        What runs where (logged as params, the run is named after the job).
    source : str, optional
        The cell's or the function's source, logged as an artifact.
    engine : str
        The job's engine (a param).
    attempt : int
        A job with restarts: which attempt this is (0 first). A later attempt goes on in the
        run of the first (``continue_run``), tagged with its number and why each earlier one
        ended; its log and epoch timing go under ``attempt_<n>/``.
    continue_run : str, optional
        The run id the earlier attempts recorded.
    earlier_attempts : tuple of str
        Why each earlier attempt ended.
    """

    def __init__(self, settings: MlflowSettings, job_id: str, np: int, where: str,
                 source: str | None = None, engine: str = "horovod", attempt: int = 0,
                 continue_run: str | None = None,
                 earlier_attempts: tuple[str, ...] = ()) -> None:
        self.engine = engine
        self.attempt, self._continue_run = attempt, continue_run
        self._earlier_attempts = earlier_attempts
        mlflow = _require_mlflow()
        from mlflow.tracking._tracking_service.utils import is_tracking_uri_set

        self.tracking_uri = mlflow.get_tracking_uri()
        self.default_store = not is_tracking_uri_set()
        # the notebook's active run and experiment live in this (the kernel's) thread
        parent = mlflow.active_run()
        self._parent_id = parent.info.run_id if parent is not None else None
        self._parent_experiment = parent.info.experiment_id if parent is not None else None
        from mlflow.tracking.fluent import _get_experiment_id

        self._current_experiment = _get_experiment_id()
        self.settings = settings
        self.job_id, self.np, self.where, self.source = job_id, np, where, source
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.failed: str | None = None
        self._client: Any = None
        self._size = abs(np)
        self._epoch_metrics: dict[int, dict[int, dict[str, float]]] = {}
        self._logged_epochs: set[int] = set()
        #: Who else recorded the job in MLflow from a rank (tracker events): rank and URI.
        self._also_recorded: dict[str, tuple[int, str]] = {}
        self._batch_size: int | None = None
        self._steps: int | None = None
        self._tasks: queue.Queue[Callable[[], None] | None] = queue.Queue()
        #: Writes the server did not take once the run existed (kept for :data:`PENDING`).
        self._pending: list[Callable[[], None]] = []
        #: Params already in the run (a later attempt's, logged by the earlier ones).
        self._logged_params: set[str] = set()
        self._worker = threading.Thread(target=self._work, name="hvd-mlflow", daemon=True)
        self._worker.start()
        self._tasks.put(self._start)

    # -- the worker thread ------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            if self.failed is not None:
                if self.run_id is not None:
                    self._pending.append(task)
                continue
            try:
                check_health(self.tracking_uri)  # at once, not after MLflow's own retries
                task()
            except Exception as exc:  # noqa: BLE001 - tracking never breaks a job
                self.failed = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                later = (" What is left is written when it answers again."
                         if self.run_id is not None else "")
                warnings.warn(f"hvd_magics: MLflow tracking at {self.tracking_uri} failed "
                              f"({self.failed}); the job goes on without it.{later}",
                              stacklevel=1)
                if self.run_id is not None:
                    self._pending.append(task)

    def _start(self) -> None:
        from mlflow import MlflowClient

        PENDING.flush(self.tracking_uri)  # what earlier jobs left, now that it answers
        client = MlflowClient(self.tracking_uri)
        if self._continue_run:
            self._continue(client, self._continue_run)
            return
        if self.settings.experiment:
            found = client.get_experiment_by_name(self.settings.experiment)
            experiment = (found.experiment_id if found is not None
                          else client.create_experiment(self.settings.experiment))
        else:
            experiment = self._parent_experiment or self._current_experiment
        tags = {"hvd_magics.job_id": self.job_id}
        if self._parent_id:
            tags["mlflow.parentRunId"] = self._parent_id
        run = client.create_run(experiment, run_name=f"horovod-{self.job_id}", tags=tags)
        self._client, self.run_id, self.experiment_id = client, run.info.run_id, experiment
        from mlflow.entities import Param

        params = {"np": str(self.np), "ranks": str(self._size), "where": self.where,
                  "engine": self.engine, **_versions()}
        client.log_batch(self.run_id, params=[Param(k, v) for k, v in params.items()])

    def _continue(self, client: Any, run_id: str) -> None:
        """A later attempt of a job with restarts: the same run, running again, tagged."""
        run = client.get_run(run_id)
        self._client, self.run_id, self.experiment_id = client, run_id, run.info.experiment_id
        self._logged_params = set(run.data.params)  # what the earlier attempts logged
        client.update_run(run_id, status="RUNNING")
        from mlflow.entities import RunTag

        tags = {"hvd_magics.attempt": str(self.attempt + 1),
                f"hvd_magics.attempt_{self.attempt + 1}.job_id": self.job_id}
        tags.update({f"hvd_magics.attempt_{i}.ended": cause[:5000]
                     for i, cause in enumerate(self._earlier_attempts, 1)})
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])

    # -- the job's events (from the driver's main loop: only bookkeeping here) ----------------
    def on_event(self, job: Any, event: Wire) -> None:
        if not is_event(event):
            return
        rank = event.get("rank")
        if rank is None:  # the driver's own (an elastic job's resize): no rank's record
            return
        if event["kind"] == TRACKER:
            self._also_recorded.setdefault(str(event.get("by")),
                                           (rank, str(event.get("uri") or "")))
        elif event["kind"] == EPOCH_BEGIN and rank == 0 and self._steps is None:
            self._steps = event.get("steps")
        elif event["kind"] == EPOCH_END and event.get("epoch") is not None:
            self._on_epoch_end(job, rank, event)

    def _on_epoch_end(self, job: Any, rank: int, event: EpochEndEvent) -> None:
        epoch = int(event["epoch"])
        samples = event.get("samples")
        if rank == 0 and self._batch_size is None and self._steps and samples:
            self._batch_size = -(-int(samples) // int(self._steps))
        metrics = {k: float(v) for k, v in (event.get("metrics") or {}).items()
                   if isinstance(v, (int, float))}
        self._epoch_metrics.setdefault(epoch, {})[rank] = metrics
        if len(self._epoch_metrics[epoch]) == self._size:
            self._log_epoch(job, epoch)

    def on_tick(self, job: Any) -> None:
        pass

    def on_end(self, job: Any) -> None:
        for epoch in sorted(self._epoch_metrics):  # epochs not every rank finished
            self._log_epoch(job, epoch)

    def _log_epoch(self, job: Any, epoch: int) -> None:
        if epoch in self._logged_epochs:
            return
        self._logged_epochs.add(epoch)
        by_rank = self._epoch_metrics[epoch].values()
        names = sorted({name for metrics in by_rank for name in metrics})
        values = {name: sum(m[name] for m in by_rank if name in m)
                  / sum(1 for m in by_rank if name in m) for name in names}
        row: dict[str, Any] = next((r for r in job.timer.rows() if r["epoch"] == epoch), {})
        if row.get("wall_s") is not None:
            values["epoch_wall_s"] = row["wall_s"]
        if row.get("samples_per_s") is not None:
            values["samples_per_s"] = row["samples_per_s"]
        stamp = int(time.time() * 1000)
        self._tasks.put(lambda: self._log_metrics(values, epoch, stamp))

    def _log_metrics(self, values: dict[str, float], epoch: int, stamp: int) -> None:
        from mlflow.entities import Metric

        self._client.log_batch(self.run_id, metrics=[Metric(k, v, stamp, epoch)
                                                     for k, v in values.items()])

    # -- the end -----------------------------------------------------------------------------
    def finish(self, record: Any) -> None:
        """Log the artifacts and the end, wait (a while) for MLflow, and note the run in
        ``record``. Called once the job's log is closed."""
        self._tasks.put(lambda: self._end(record))
        self._tasks.put(None)
        wait = LOCAL_FINISH_WAIT_S if local_store(self.tracking_uri) else FINISH_WAIT_S
        self._worker.join(wait)
        if self._worker.is_alive():
            self.failed = self.failed or f"no answer within {wait:.0f} s"
            warnings.warn(f"hvd_magics: MLflow at {self.tracking_uri} did not answer within "
                          f"{wait:.0f} s; the run may be incomplete.", stacklevel=2)
        if self.run_id is not None:
            record.mlflow_run_id = self.run_id
            store = " (no tracking URI was set: MLflow's local default store)" \
                if self.default_store else ""
            url = ui_url(self.tracking_uri, self.experiment_id or "0", self.run_id)
            record.mlflow = (f"run {self.run_id} in {self.tracking_uri}{store}"
                             + (f", {url}" if url else "") + self._incomplete()
                             + also_recorded(self._also_recorded))
            if self._pending and not self._worker.is_alive():
                PENDING.add(self.tracking_uri, self.run_id, self._pending, record)
        elif self.failed:
            record.mlflow = f"not recorded: {self.failed}"

    def _incomplete(self) -> str:
        if not self.failed:
            return ""
        if not self._pending or self._worker.is_alive():
            return f"; incomplete: {self.failed}"
        return (f"; incomplete: {self.failed}; {len(self._pending)} writes (metrics, artifacts, "
                f"the run's end) are kept and written when the server answers again (tried "
                f"every {retry_s():.0f} s in the background, and at the next tracked job)")

    def _end(self, record: Any) -> None:
        client, run_id = self._client, self.run_id
        if self._batch_size is not None and "batch_size" not in self._logged_params:
            client.log_param(run_id, "batch_size", str(self._batch_size))
        # a later attempt's files go beside the first's, under its own folder
        folder = f"attempt_{self.attempt + 1}" if self.attempt else None
        if record.log_path:
            client.log_artifact(run_id, record.log_path, folder)
        if record.epochs:
            client.log_text(run_id, epochs_csv(record.epochs),
                            f"{folder}/epoch_timing.csv" if folder else "epoch_timing.csv")
        log_step_split(client, run_id, record, folder)
        if self.source and not self.attempt:
            client.log_text(run_id, self.source, "source.py")
        if record.timeline_path:
            client.log_artifact(run_id, record.timeline_path, folder)
        if record.error:
            client.set_tag(run_id, "hvd_magics.error", record.error[:5000])
        elif self.attempt:  # an earlier attempt's loss is in its own tag now
            client.delete_tag(run_id, "hvd_magics.error")
        with url_not_printed():  # the summary links the run; no line from this thread
            client.set_terminated(run_id, STATUS.get(record.status, "FAILED"))


def log_step_split(client: Any, run_id: str | None, record: Any, folder: str | None) -> None:
    """Each rank's mean step split as metrics (``rank_1.comm_s``), the intervals as a CSV and
    the straggler verdicts as a tag, in run ``run_id``."""
    for row in record.step_split:
        for part in ("step_s", "input_s", "compute_s", "comm_s", "cpu_wait_s"):
            client.log_metric(run_id, f"rank_{row['rank']}.{part}", row[part])
    if record.step_intervals:
        client.log_text(run_id, record.steps.to_csv(index=False),
                        f"{folder}/step_split.csv" if folder else "step_split.csv")
    if record.stragglers:
        client.set_tag(run_id, "hvd_magics.straggler", "\n".join(record.stragglers)[:5000])


#: How to stop each library that records the job in MLflow on its own.
STOP_RECORDING = {
    "transformers": "TrainingArguments(report_to=[])",
    "pytorch_lightning": "a Trainer without MLFlowLogger",
    "lightning": "a Trainer without MLFlowLogger",
    "accelerate": "Accelerator() without log_with='mlflow'",
    "the cell": "no mlflow.start_run() or autolog() in the cell",
}


def also_recorded(recorders: dict[str, tuple[int, str]]) -> str:
    """What the summary adds when ranks recorded the job in MLflow themselves: who, where, and
    how to keep one run (``""`` when none did)."""
    if not recorders:
        return ""
    said = "; ".join(f"{by} on rank {rank}" + (f" in {uri}" if uri else "")
                     for by, (rank, uri) in recorders.items())
    stops = " or ".join(STOP_RECORDING.get(by, f"{by} without MLflow") for by in recorders)
    return (f"; also recorded in a run of its own by {said}: one job, two runs. Keep this one "
            f"with {stops}, or the other with --no-mlflow")


@contextlib.contextmanager
def url_not_printed() -> Iterator[None]:
    """Keep MLflow from writing "View run ... at" to the notebook's stdout from a background
    thread (it would land in whichever cell runs then). The job waits meanwhile."""
    saved = os.environ.get(_SUPPRESS_URL)
    os.environ[_SUPPRESS_URL] = "true"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(_SUPPRESS_URL, None)
        else:
            os.environ[_SUPPRESS_URL] = saved


def epochs_csv(rows: list[dict[str, Any]]) -> str:
    """The epoch timing rows as CSV (per-rank seconds as ``rank<N>_s`` columns)."""
    ranks = sorted({rank for row in rows for rank in row.get("rank_seconds", {})})
    fields = ["epoch", "wall_s", "slowest_rank_s", "line_to_line_s", "samples", "samples_per_s"]
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(fields + [f"rank{r}_s" for r in ranks])
    for row in rows:
        seconds = row.get("rank_seconds", {})
        writer.writerow([row.get(f) for f in fields] + [seconds.get(r) for r in ranks])
    return out.getvalue()
