"""One record per run: what ran where, how it ended, what it returned. Prints well as text and
HTML."""
from __future__ import annotations

import html
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hvd_magics.common.sizes import byte_size
from hvd_magics.job.records.epoch_timing import format_html_table, format_table
from hvd_magics.job.readings.step_parts import StepParts, clock_label


@dataclass
class RunRecord:
    """The record of one Horovod job.

    Attributes
    ----------
    job_id : str
        Unique id (also the Spark job group, ``hvd_magics-<job_id>``).
    np : int
        As given: positive for Spark ranks, negative for ranks on the driver.
    where : str
        ``"spark local[2]"``, ``"spark spark://host:7077"`` or ``"driver"``.
    status : str
        ``"running"``, ``"succeeded"``, ``"failed"``, ``"interrupted"`` or ``"preempted"`` (the
        ranks saved and ended on a preemption notice; with ``restarts`` the next attempt's
        record is the job's).
    exit_codes : dict
        Rank to exit code (``None`` for a rank that never exited on its own).
    hosts, pids : dict
        Rank to host and to process id.
    value : object
        What ``main`` (or the cell) returned on rank 0.
    returned : dict
        Variables copied back into the notebook by ``%%horovod --return``.
    values : list or None
        Every rank's value, in rank order, for a job that asked for them (``@distributed``).
    epochs : list of dict
        Epoch timing rows (filled when ranks report epochs).
    log_path : str
        The driver-side file with every line of every rank.
    timeline_path : str or None
        The Horovod Timeline file on the driver, when one was recorded.
    engine : str
        What the ranks ran on: ``"horovod"``, ``"torch"`` (torch.distributed) or ``"tf"``
        (tf.distribute).
    charts_html : str
        The job's charts (loss and metrics per step and epoch, samples/s per rank) as inline
        SVG; part of the record's HTML, so saved notebooks and their exports keep them.
    mlflow_run_id : str or None
        The MLflow run that recorded the job, when one did.
    mlflow : str
        Where that run is (or why it is not there), as the summary shows it.
    mlflow_model_uri : str or None
        The model a :class:`~hvd_magics.estimator.HorovodEstimator` fit logged to that run.
    elastic : str or None
        ``"MIN:MAX"`` of an elastic job (``np`` is then its maximum), else ``None``.
    final_size : int or None
        How many ranks an elastic job had at its end (``None`` if it never started).
    resets : list of dict
        Each time an elastic job's ranks re-formed: ``reset`` (1, 2, ...), ``size`` (ranks
        after it), ``ranks`` (Spark task to Horovod rank), ``causes`` (what changed: a task
        lost, a rank that exited, tasks that joined) and ``time`` (epoch seconds).
    attempts : list of str
        A job with restarts: why each earlier attempt ended (a loss, in one line), then
        ``"succeeded"``; empty for a job that ran once.
    shards : list of dict
        Per DataFrame the job read: ``name``, ``rows_per_rank`` (rank order), ``bytes`` (Arrow
        bytes of all shards), ``write_s`` (the longest time a task spent writing its shard to
        local disk) and ``wait_s`` (the longest time a task waited for Spark's rows).
    step_split : list of dict
        Per rank that stepped an optimizer (PyTorch): ``rank``, ``host``, ``steps`` and its
        mean step's seconds ``step_s`` split into ``input_s`` (waiting for batches),
        ``compute_s`` and ``comm_s`` (waiting in collectives); see
        :mod:`hvd_magics.rank.instruments.step_split`.
    step_intervals : list of dict
        The same, per rank every quarter second or so (with ``time_s`` since the job began):
        what :attr:`steps` gives as a DataFrame.
    stragglers : list of str
        Each rank (or host) found holding the others back, from which step, and when it
        caught up (:mod:`hvd_magics.job.verdicts.straggler`); empty when none was.
    links : str
        When every rank waited in communication for most of its steps, the hosts' links as
        the driver measured them (:mod:`hvd_magics.job.verdicts.links`); else ``""``.
    kept : str
        What keeping every step in the hosts' memory held and cost (``checkpoint.keep``), in
        words; ``""`` when no step was kept.
    kept_stall_s : float
        Seconds the ranks' loops waited for those copies (the first rank of each host).
    """

    job_id: str
    np: int
    where: str = ""
    status: str = "running"
    started_at: datetime = field(default_factory=datetime.now)
    ended_at: datetime | None = None
    exit_codes: dict[int, int | None] = field(default_factory=dict)
    hosts: dict[int, str] = field(default_factory=dict)
    pids: dict[int, int] = field(default_factory=dict)
    value: Any = None
    returned: dict[str, Any] = field(default_factory=dict)
    values: list[Any] | None = None
    epochs: list[dict[str, Any]] = field(default_factory=list)
    log_path: str = ""
    timeline_path: str | None = None
    shards: list[dict[str, Any]] = field(default_factory=list)
    mlflow_run_id: str | None = None
    mlflow: str = ""
    mlflow_model_uri: str | None = None
    error: str = ""
    elastic: str | None = None
    resets: list[dict[str, Any]] = field(default_factory=list)
    final_size: int | None = None
    startup_s: float | None = None
    training_s: float | None = None
    engine: str = "horovod"
    attempts: list[str] = field(default_factory=list)
    step_split: list[dict[str, Any]] = field(default_factory=list)
    step_intervals: list[dict[str, Any]] = field(default_factory=list, repr=False)
    stragglers: list[str] = field(default_factory=list)
    links: str = ""
    kept: str = ""
    kept_stall_s: float = 0.0
    #: The job's charts (loss, metrics, samples/s) as inline SVG, for saved notebooks.
    charts_html: str = field(default="", repr=False)

    def to_pandas(self) -> Any:
        """The epoch rows as a pandas DataFrame (needs pandas)."""
        import pandas as pd

        return pd.DataFrame(self.epochs)

    @property
    def steps(self) -> Any:
        """Each rank's training steps split into input, compute and communication, a few rows
        a second per rank, as a pandas DataFrame: ``rank``, ``host``, ``time_s`` (since the job
        began), ``steps`` (how many the row covers) and their mean ``step_s``, ``input_s``,
        ``compute_s``, ``comm_s``, and ``cpu_wait_s`` and ``cpu_s``: how long the rank's training
        thread waited for a CPU and ran on one in its own work (outside collectives; 0 where
        Linux does not say), what a verdict of "waiting for a CPU" rests on (needs pandas)."""
        import pandas as pd

        columns = ["rank", "host", "time_s", "steps", "step_s", "input_s", "compute_s", "comm_s",
                   "cpu_wait_s", "cpu_s"]
        return pd.DataFrame(self.step_intervals, columns=columns)

    @property
    def size(self) -> int:
        """Number of ranks."""
        return abs(self.np)

    @property
    def wall_time_s(self) -> float | None:
        """Seconds from submission to the end of the job."""
        if self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()

    def _rows(self) -> list[tuple[str, str]]:
        wall = f"{self.wall_time_s:.2f} s" if self.wall_time_s is not None else "-"
        codes = ", ".join(f"{r}:{c}" for r, c in sorted(self.exit_codes.items())) or "-"
        ranks = str(self.size) if not self.elastic else (
            f"elastic {self.elastic}, ended with {self.final_size}" if self.final_size
            else f"elastic {self.elastic}")
        rows = [("job", self.job_id), ("status", self.status), ("ranks", ranks),
                ("where", self.where)] + ([("engine", _ENGINE_NAMES.get(self.engine, self.engine))]
                                          if self.engine != "horovod" else []) + [
                    ("started", self.started_at.strftime("%Y-%m-%d %H:%M:%S")),
                    ("wall time", wall), ("exit codes", codes)]
        for reset in self.resets:
            rows.append((f"reset {reset['reset']}", describe_reset(reset)))
        rows.extend((f"attempt {i + 1}", why) for i, why in enumerate(self.attempts))
        if self.returned:
            rows.append(("returned", ", ".join(self.returned)))
        if self.value is not None:
            rows.append(("value", _short(repr(self.value))))
        rows.extend((f"data {s['name']}", describe_shards(s)) for s in self.shards)
        if self.startup_s is not None:
            rows.append(("start-up", f"{self.startup_s:.2f} s (launch, imports, init)"))
        if self.training_s is not None:
            rows.append(("training", f"{self.training_s:.2f} s over {len(self.epochs)} epochs"))
        rows.extend(self._split_rows())
        if self.kept:
            rows.append(("kept steps", self.kept))
        if self.timeline_path:
            rows.append(("timeline", self.timeline_path))
        if self.mlflow:
            rows.append(("mlflow", self.mlflow))
        if self.error:
            rows.append(("error", _short(self.error.splitlines()[0])))
        rows.append(("logs", self.log_path))
        return rows

    def _split_rows(self) -> list[tuple[str, str]]:
        """Each rank's mean step and its split (up to :data:`SPLIT_RANKS_SHOWN` ranks: the
        slowest first), then the straggler verdicts."""
        rows = sorted(self.step_split, key=lambda row: -(row["input_s"] + row["compute_s"]))
        out = [(f"steps of rank {row['rank']}", describe_split(row))
               for row in sorted(rows[:SPLIT_RANKS_SHOWN], key=lambda row: row["rank"])]
        if len(rows) > SPLIT_RANKS_SHOWN:
            out.append(("steps", f"{len(rows) - SPLIT_RANKS_SHOWN} more ranks in .steps"))
        if len(rows) > 1:
            out += [("straggler", line) for line in self.stragglers] or [
                ("straggler", "none: no rank held the others back")]
        if self.links:
            out.append(("links", self.links))
        return out

    def __str__(self) -> str:
        width = max(len(k) for k, _ in self._rows())
        text = "\n".join([f"{run_title(self.engine)} {self.job_id}"] +
                         [f"  {k:<{width}}  {v}" for k, v in self._rows()])
        if self.epochs:
            text += "\nepoch timing\n" + format_table(self.epochs)
        return text

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str:
        colour = {"succeeded": "#2e7d32", "failed": "#c62828", "interrupted": "#ef6c00",
                  "preempted": "#6d4c41"}.get(
            self.status, "#1565c0")
        body = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                       f"<td style='text-align:left'>{html.escape(v)}</td></tr>"
                       for k, v in self._rows())
        return (f"<div class='hvd-run-record'><b style='color:{colour}'>"
                f"{run_title(self.engine)} {html.escape(self.status)}</b><table>{body}</table>"
                f"{self.charts_html}"
                f"{self._epochs_html()}</div>")

    def _epochs_html(self) -> str:
        return f"<b>epoch timing</b>{format_html_table(self.epochs)}" if self.epochs else ""


#: Ranks whose step split the record lists (the others are in :attr:`RunRecord.steps`).
SPLIT_RANKS_SHOWN = 8


def describe_split(row: dict[str, Any]) -> str:
    """``"59 steps of 0.038 s: input 0% · compute 83% · comm 17%"``."""
    shares = StepParts(row["step_s"], row["input_s"], row["comm_s"]).shares(
        clock_label(row.get("clock", "host"), "gpu_peak_bytes" in row))
    peak = (f"; GPU memory peak {row['gpu_peak_bytes'] / 1024 ** 3:.1f} GB"
            if row.get("gpu_peak_bytes") else
            f"; memory peak {row['peak_bytes'] / 1024 ** 3:.1f} GB" if row.get("peak_bytes")
            else "")
    if row.get("params_full_bytes"):
        peak += (f"; parameters {byte_size(row['param_bytes'], binary=True)} of "
                 f"{byte_size(row['params_full_bytes'], binary=True)}")
    return f"{row['steps']:,} steps of {row['step_s']:.3g} s: {shares}{peak}"


def describe_shards(shard: dict[str, Any]) -> str:
    """``"5,000 rows as 2,500 + 2,500 (rank 0 + 1), 31.4 MB, written in 0.12 s"``."""
    counts = shard["rows_per_rank"]
    split = " + ".join(f"{c:,}" for c in counts) if len(counts) <= 8 else (
        f"{min(counts):,} to {max(counts):,} per rank")
    return (f"{sum(counts):,} rows as {split} per rank, {shard['bytes'] / 1e6:,.1f} MB, "
            f"written to local disk in {shard['write_s']:.2f} s")


def describe_reset(reset: dict[str, Any]) -> str:
    """``"task 1 was lost (its executor went away); 2 ranks after it"``."""
    causes = "; ".join(reset.get("causes") or []) or "the ranks re-formed"
    return f"{causes}; {reset['size']} rank{'s' if reset['size'] != 1 else ''} after it"


#: How the record names each engine.
_ENGINE_NAMES = {"torch": "torch.distributed", "tf": "tf.distribute"}


def run_title(engine: str) -> str:
    """What a job of ``engine`` is called: ``"HorovodRun"``, ``"torch.distributed run"``, ...
    (a torch job's record said "HorovodRun succeeded")."""
    return f"{_ENGINE_NAMES[engine]} run" if engine in _ENGINE_NAMES else "HorovodRun"


def job_title(engine: str) -> str:
    """The dashboard's name of a job of ``engine``: ``"Horovod job"``, ``"torch.distributed
    job"``, ``"tf.distribute job"``."""
    return f"{_ENGINE_NAMES.get(engine, 'Horovod')} job"


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."
