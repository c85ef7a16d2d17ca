"""What the runner asks of every backend, written once: a Spark barrier stage
(:class:`~hvd_magics.launch.spark_backend.SparkBackend`), an elastic stage
(:class:`~hvd_magics.launch.elastic_backend.ElasticSparkBackend`), ranks as processes on the
driver (:class:`~hvd_magics.launch.driver_backend.DriverBackend`) and one cell of a warm pool
(:class:`hvd_magics.job.pool_cell.PoolCell`). Each implements it; no caller asks ``hasattr`` or
``isinstance`` of a backend (``tests/unit/test_layout.py`` checks every member is there).
"""
from __future__ import annotations

from typing import Any, Protocol

from hvd_magics.channel import EventSink


class Backend(Protocol):
    """Starts a job's ranks, tells the runner how they are doing, and stops them."""

    #: Where the ranks run, for people: ``spark local[2]``, ``driver (warm pool)``.
    where: str
    #: Whether the ranks outlive the job (a warm pool's cell).
    keeps_ranks: bool
    #: What a warm pool says after a cell's error when it restarted its ranks (else ``""``).
    restart_note: str

    def start(self, payload: bytes, job_id: str, events: EventSink) -> None:
        """Start the ranks on ``payload``; their events go to ``events``."""

    @property
    def live(self) -> bool:
        """Whether events arrive while the job runs (not only at its end)."""

    @property
    def reads_data(self) -> bool:
        """Whether the ranks wait for DataFrame rows (the start clock begins when they arrive)."""

    @property
    def finished(self) -> bool:
        """Whether the job has ended (the Spark stage, the rank processes, the cell)."""

    @property
    def drained(self) -> bool:
        """Whether everything the ranks sent has arrived."""

    @property
    def refused(self) -> str | None:
        """Why the tasks refused the job's rows before any rank got it, or ``None``."""

    def request_stacks(self, request: str) -> None:
        """Ask every running rank for its Python stacks (``stacks`` events with ``request``)."""

    def stop(self) -> None:
        """Stop every rank (a warm pool: interrupt the cell)."""

    def join(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the job to end; whether it did."""

    def describe_failure(self) -> str | None:
        """Why the job failed as a whole (Spark's reason, a lost server), or ``None``."""

    def silence_note(self, ranks: list[int]) -> str:
        """What to say of ``ranks`` that were never heard from (a start timeout)."""

    def heard_ago(self, now: float) -> dict[int, float]:
        """Per rank whose supervisor reached the driver over the network: the seconds since it
        was last heard (its beats, :mod:`hvd_magics.channel`); ``{}`` where ranks cannot be
        lost apart from the driver (ranks on the driver, a warm pool's cell) or an elastic
        job goes on without them."""

    def probe_link(self, rank: int, order: dict[str, Any]) -> bool:
        """Send the link probe ``order`` (``probe_link``) to the task of ``rank``, whose channel
        answers it; ``False`` where it was not sent (no channel over the network: ranks on the
        driver, a warm pool's cell)."""

    def took_every_rank(self) -> str | None:
        """What went away and took every rank's task with it, when that is what ended the job
        (the Spark Connect server: ``"the Spark Connect server at ... does not answer ..."``);
        ``None`` otherwise. The job's error then names it first, not a rank."""

    def decommissioning(self, tasks: dict[int, int]) -> dict[int, tuple[str, str]]:
        """Of the ranks whose Spark task attempt ids are ``tasks`` (rank -> id), those whose
        executor Spark is decommissioning (``spark.decommission.enabled``: a spot instance
        taken back, a drained node), as rank -> ``(executor id, host)``; ``{}`` where Spark's
        scheduler is out of reach (ranks on the driver, Spark Connect) or none is."""

    def preempt(self, at: int, notice: str) -> None:
        """Tell every rank its executors are being taken away: ``checkpoint.preempting()`` is
        True from its call ``at`` on (:mod:`hvd_magics.rank.api.preemption`)."""

    def lose_host(self, host: str) -> None:
        """The host ``host`` (an executor's address) was taken for lost: give it no more work
        (a restart must not be scheduled on its executors, which Spark still counts as alive
        for a minute or two)."""

    def unpacking(self) -> tuple[float, str] | None:
        """While the executors may still fetch and unpack what the job sent them before any
        rank can start (a shipped environment, new to them): how many seconds more the start
        may take for it, and what they are doing, in a few words; else ``None``."""

    def missing_module_fix(self) -> str:
        """What to do when a rank could not import a module (the executors lack it), or
        ``""`` where the ranks run the notebook's own Python."""
