"""Every kind of :data:`hvd_magics.protocol.EVENTS` as a typed record: the wire's fields written
once, as types that the sending and the reading side both use and mypy checks.

A record is a ``TypedDict`` whose ``kind`` is its kind's ``Literal``; building one is building the
plain dict JSON carries (``ExitEvent(kind=EXIT, code=0)``), so the wire is what it was. A reader
annotates what it reads with the record, and a misspelled field is a type error. The stamps added
on the way (:class:`Stamps`) may be in any event a rank's supervisor sends; a field that only some
senders give is in a ``total=False`` part of its record.

Unions: :data:`RankEvent` (what a rank writes to its pipe), :data:`Event` (what reaches the
driver's queue: the ranks', their supervisors', the channel's and the driver's own), :data:`Order`
(what the driver sends a task). A dict off the wire becomes a record through
:func:`hvd_magics.protocol.is_event` (a ``TypeGuard``), then a comparison of its ``kind`` with a
kind's name narrows the union to that kind's record.
"""
from __future__ import annotations

from typing import Any, Literal, TypedDict, cast


class Stamps(TypedDict, total=False):
    """What travels with an event besides its own fields: ``rtime`` (the rank's clock, on the
    rank's own events), ``rank``, ``host``, ``time``, ``job`` (stamped by its supervisor; ``rank``
    is ``None`` on the driver's own events), ``recv`` (the driver's monotonic clock on arrival)."""

    rtime: float
    rank: int | None
    host: str
    time: float
    job: str
    recv: float


# -- what the fields hold ---------------------------------------------------------------------
class GpuReading(TypedDict):
    """The rank's CUDA device: bytes in use, their peak and the device's total; its utilisation
    in percent (``None`` where NVML does not say)."""

    device: int
    used: int
    peak: int
    total: int
    util: float | None


class _MemoryReading(TypedDict):
    rss: int | None
    peak: int


class MemoryReading(_MemoryReading, total=False):
    """The rank's resident and peak host memory (bytes); in sharded training the bytes of
    parameters it holds and of the whole model."""

    params: int
    params_full: int


class DdpSteps(TypedDict):
    """The DDP training steps a rank took, and whether it is inside the ``backward()`` whose end
    waits for every rank's gradients."""

    steps: int
    syncing: bool


class ThreadStack(TypedDict):
    """One thread's stack: its name, whether it is the main thread, and its frames outermost
    first, each ``[file, line, function, code, kind]`` (kind ``"user"`` or ``"library"``)."""

    name: str
    main: bool
    frames: list[list[Any]]


class ShardFields(TypedDict):
    """One source's shard as a task wrote it (:class:`hvd_magics.task.shard_files.ShardFile`)."""

    source: int
    path: str
    rows: int
    bytes: int
    write_s: float
    wait_s: float
    nulls: dict[str, int]


class ShardReport(ShardFields):
    """A shard as ``task_started`` reports it: with its DataFrame's name."""

    name: str


class MeetMessage(TypedDict):
    """What a rank's task offers the others when the tasks meet: its rendezvous port (``0``:
    none), its setup error (``""``: none), its GPUs and its shards."""

    port: int
    error: str
    gpus: list[str]
    shards: list[ShardFields]


# -- sent by the rank process -----------------------------------------------------------------
class StartedEvent(Stamps):
    """The rank process runs (its pid is its process group)."""

    kind: Literal["started"]
    pid: int


class ErrorEvent(Stamps):
    """The job's function raised."""

    kind: Literal["error"]
    error: str
    message: str
    traceback: str


class ResultEvent(Stamps):
    """The function returned; rank 0's value parts (hvd_magics.result_codec), every rank's when the
    job asked for them (HVD_MAGICS_EVERY_RESULT), else None."""

    kind: Literal["result"]
    parts: dict[str, dict[str, Any]] | None


class LeavingEvent(Stamps):
    """The job's function returned; the rank now leaves its engine with the others (a peer still in
    a collective then waits for one this rank will never enter); steps: the DDP training steps it
    took (hvd_magics.rank.instruments.ddp_watch), else None."""

    kind: Literal["leaving"]
    steps: int | None


class LogEvent(Stamps):
    """What the job's code said with ``hvd_magics.log_to_driver(text)``."""

    kind: Literal["log"]
    text: str


class RunLogEvent(Stamps):
    """Lines for the run's log file only: what a library would have printed that the dashboard shows
    otherwise (a Trainer's logged values)."""

    kind: Literal["run_log"]
    lines: list[str]


class TrackerEvent(Stamps):
    """The rank records the job in MLflow itself: who asked for the run (a library with an MLflow
    integration, or the cell) and its tracking URI; once per recorder."""

    kind: Literal["tracker"]
    by: str
    uri: str


class EpochBeginEvent(Stamps):
    """An epoch begins."""

    kind: Literal["epoch_begin"]
    epoch: int
    epochs: int | None
    steps: int | None


class ProgressEvent(Stamps):
    """Progress within an epoch (at most 4 a second)."""

    kind: Literal["progress"]
    epoch: int
    step: int
    steps: int | None
    samples_per_s: float | None
    metrics: dict[str, float]


class EpochEndEvent(Stamps):
    """An epoch ended."""

    kind: Literal["epoch_end"]
    epoch: int
    epochs: int | None
    duration: float
    samples: int | None
    metrics: dict[str, float]


class _StepSplitFields(Stamps):
    kind: Literal["step_split"]
    rows: list[list[float]]
    totals: list[float]
    dropped: int
    gpu: GpuReading | None
    memory: MemoryReading
    clock: Literal["gpu", "host"]
    pace: list[list[float]]


class StepSplitEvent(_StepSplitFields, total=False):
    """Each training step's time split (hvd_magics.rank.instruments.step_split), at most 4 a second:
    rows [step, step_s, input_s, comm_s, cpu_wait_s, cpu_s, input_cpu_wait_s, input_cpu_s] of the
    steps since the last such event (the latest STEP_ROWS_SENT; dropped: how many earlier ones were
    left out; cpu_wait_s, cpu_s: the training thread's wait for a CPU and time on one outside
    collectives, input_cpu_wait_s, input_cpu_s: of those, in waits for input; TensorFlow's rows may
    end after comm_s), totals [steps, and the sum of each column] of them all; gpu: the rank's CUDA
    device's memory and utilisation (hvd_magics.rank.instruments.gpu_memory), else None; memory: the
    rank's resident and peak host memory, and in sharded training the bytes of parameters it holds
    and of the whole (hvd_magics.rank.instruments.rank_memory); clock: 'gpu' when the rows are the
    GPU's time (hvd_magics.rank.instruments.gpu_steps), else 'host'; pace: [step, seconds] of each
    probe of the training thread's CPU since the last such event (a fixed piece of work timed on the
    thread's CPU clock after that step: a CPU shared with other work runs it slower)."""

    #: ``False`` on TensorFlow's rows: they carry no CPU columns to read.
    cpu_read: bool


class PreemptCallsEvent(Stamps):
    """How many times the rank has called checkpoint.preempting() (at most twice a second, once it
    has; hvd_magics.rank.api.preemption)."""

    kind: Literal["preempt_calls"]
    calls: int


class KeptEvent(Stamps):
    """A part of a step is whole in a host's memory (checkpoint.keep; hvd_magics.rank.api.keeping):
    part 'part' of 'parts' of step 'step', on host 'holder' (as its task named it), whose keeper
    serves at 'keeper' (host:port, "" when none started); 'nbytes' its size, 'copy_s' how long
    its copy took, 'stall_s' how long the loop waited for it; 'peer': a copy the rank sent to
    the next host's keeper (a sharded state's ring), not its own host's."""

    kind: Literal["kept"]
    step: int
    part: int
    parts: int
    holder: str
    keeper: str
    nbytes: int
    copy_s: float
    stall_s: float
    peer: bool


class StacksEvent(Stamps):
    """The rank's Python stacks, taken on request while it runs
    (hvd_magics.rank.instruments.stack_report): per thread its name and frames, outermost first,
    each [file, line, function, code, kind] with kind 'user' or 'library' (hvd_magics' own frames
    left out); others: how many threads showed no frame of the user's; ddp: {steps, syncing} when it
    took DDP training steps (syncing: inside the backward() whose end waits for every rank's
    gradients), else None."""

    kind: Literal["stacks"]
    request: str
    threads: list[ThreadStack]
    others: int
    ddp: DdpSteps | None


class ImportedEvent(Stamps):
    """The frameworks of ZYGOTE_MODULES the job imported, at its end; its supervisor keeps this to
    itself (the next rank of its environment starts from a zygote that has imported them:
    hvd_magics.task.zygotes)."""

    kind: Literal["imported"]
    modules: list[str]


# -- sent by the supervisor -------------------------------------------------------------------
class ShardingEvent(Stamps):
    """The Spark task receives its rows of the job's DataFrames (its data arrives)."""

    kind: Literal["sharding"]
    partition: int
    hostname: str


class _TaskStartedFields(Stamps):
    kind: Literal["task_started"]
    partition: int
    local_rank: int
    pid: int


class TaskStartedEvent(_TaskStartedFields, total=False):
    """The Spark task (or driver slot) got its rank and starts the process; task: the Spark task
    attempt id (None on the driver); shards: per DataFrame its name, rows, bytes and seconds spent
    writing it; data (a warm pool's task only): [host, port] of its shard receiver
    (hvd_magics.task.shard_receiver); met (a barrier task only): how the tasks met, 'driver' (the
    MEET order) or 'spark' (allGather). A driver slot's says only its partition, local_rank and
    pid."""

    hostname: str
    task: int | None
    shards: list[ShardReport]
    met: str
    data: list[Any]


class MeetOfferEvent(Stamps):
    """A barrier task is ready to meet the others: what it gives Spark's allGather too (its port,
    setup error and shards); the driver keeps these to itself and, once every task has offered,
    answers each with MEET."""

    kind: Literal["meet_offer"]
    partition: int
    message: MeetMessage


class TaskErrorEvent(Stamps):
    """The supervisor itself failed."""

    kind: Literal["task_error"]
    traceback: str


class _OutputFields(Stamps):
    kind: Literal["output"]
    lines: list[str]


class OutputEvent(_OutputFields, total=False):
    """Complete lines of the rank's stdout/stderr. ``shown`` and ``kept``: added by the driver once
    applied (:data:`hvd_magics.job.job_state.SHOWN`, :data:`~hvd_magics.job.job_state.KEPT`)."""

    shown: list[str]
    kept: list[str]


class OutputPartialEvent(Stamps):
    """The unfinished line as a terminal shows it (a progress bar drawn with \\r)."""

    kind: Literal["output_partial"]
    text: str


class TimelineLocalEvent(Stamps):
    """Where rank 0 writes its timeline."""

    kind: Literal["timeline_local"]
    path: str


class TimelineChunkEvent(Stamps):
    """Base64 bytes of rank 0's timeline (from its supervisor when the rank ends; from a warm
    pool's rank after each cell it recorded)."""

    kind: Literal["timeline_chunk"]
    data: str


class _ExitFields(Stamps):
    kind: Literal["exit"]
    code: int | None


class ExitEvent(_ExitFields, total=False):
    """The rank process ended; always its last event (``how``: only when its keeper could not say
    the code: what is known)."""

    how: str


class SlotOfferEvent(Stamps):
    """An elastic job's Spark task is ready to run a rank; ``slot_host`` is the name Horovod's
    elastic driver knows it by (one slot per task attempt)."""

    kind: Literal["slot_offer"]
    partition: int
    attempt: int
    slot_host: str
    hostname: str


class CellEndEvent(Stamps):
    """A warm pool's rank ended a cell (its RESULT or ERROR was sent before): every line the cell
    printed came before this."""

    kind: Literal["cell_end"]


# -- sent by the driver to the job's views (elastic jobs) -------------------------------------
class ResizeEvent(Stamps):
    """An elastic job (re)assigned its ranks: ``ranks`` maps task to Horovod rank, ``reset`` counts
    the resets (0 at the start), ``causes`` says what changed."""

    kind: Literal["resize"]
    size: int
    ranks: dict[int, int]
    reset: int
    causes: list[str]


class DriverLogEvent(Stamps):
    """A line of the driver's own (Horovod's elastic driver) for the job's log file."""

    kind: Literal["driver_log"]
    text: str


# -- orders the driver sends to a task --------------------------------------------------------
class StartRankOrder(TypedDict):
    """An order to an elastic job's waiting task: start the rank with this environment."""

    kind: Literal["start_rank"]
    env: dict[str, str]


class RunCellOrder(TypedDict):
    """An order to a warm pool's task: write this stdin frame (base64 of encode_job) to the rank,
    which runs it in its kept namespace."""

    kind: Literal["run_cell"]
    frame: str


class InterruptCellOrder(TypedDict):
    """An order to a warm pool's task: interrupt the rank's cell (SIGINT)."""

    kind: Literal["interrupt_cell"]


class EndPoolOrder(TypedDict):
    """An order to a warm pool's task: end the rank's stdin; the rank leaves Horovod together with
    its peers and exits."""

    kind: Literal["end_pool"]


class DropShardsOrder(TypedDict):
    """An order to a warm pool's task: delete the shards of that deal (no kept DataFrame uses them
    any more)."""

    kind: Literal["drop_shards"]
    deal: str


class TakeStacksOrder(TypedDict):
    """An order to a task: have the rank report its stacks (a STACKS event with this request id)
    without stopping it."""

    kind: Literal["take_stacks"]
    request: str


class MeetOrder(TypedDict):
    """An order to every barrier task: the tasks' MEET_OFFER messages in partition order, as
    allGather would return them (hvd_magics.task.task_meeting)."""

    kind: Literal["meet"]
    gathered: list[MeetMessage]


class ProbeLinkOrder(TypedDict):
    """An order to a task's channel: answer at once with a LINK_PROBE carrying answer_bytes bytes;
    data (base64) is what the driver sends down (hvd_magics.job.readings.link_probe measures each
    host's link by the round trip)."""

    kind: Literal["probe_link"]
    request: str
    data: str
    answer_bytes: int


class PreemptOrder(TypedDict):
    """The job's executors are being decommissioned: checkpoint.preempting() is True on every rank
    from its call number 'at' on (hvd_magics.rank.api.preemption); notice: why, in words."""

    kind: Literal["preempt"]
    at: int
    notice: str


# -- the channel itself -----------------------------------------------------------------------
class HelloFrame(TypedDict):
    """First frame of a connection (authenticates it)."""

    kind: Literal["hello"]
    job: str
    rank: int


class ByeFrame(TypedDict):
    """Last frame of a connection that ends cleanly."""

    kind: Literal["bye"]


class BeatFrame(TypedDict):
    """The supervisor is there: every BEAT_EVERY_S (hvd_magics.channel); the driver notes when it
    last heard each rank's supervisor and queues no event for it."""

    kind: Literal["beat"]


class _LinkProbeFields(Stamps):
    kind: Literal["link_probe"]
    request: str


class LinkProbeEvent(_LinkProbeFields, total=False):
    """The answer to a PROBE_LINK order, sent by the task's channel itself: its request id and the
    bytes asked for (base64); then a second one with the request id and cpu_wait_s, the seconds the
    channel's thread waited for a CPU from the order's first byte to the answer's last (None where
    Linux does not say). The first answer carries ``data``, the second ``cpu_wait_s``."""

    data: str
    cpu_wait_s: float | None


class ChannelClosedEvent(Stamps):
    """Queued by the driver when a connection ends; not clean: its executor was lost."""

    kind: Literal["channel_closed"]
    clean: bool


#: What a rank writes to its event pipe.
RankEvent = (StartedEvent | ErrorEvent | ResultEvent | LeavingEvent | LogEvent | RunLogEvent |
             TrackerEvent | EpochBeginEvent | ProgressEvent | EpochEndEvent | StepSplitEvent |
             PreemptCallsEvent | StacksEvent | ImportedEvent | TimelineChunkEvent | KeptEvent)
#: What reaches the driver's queue (and what a supervisor's sink takes).
Event = (RankEvent | ShardingEvent | TaskStartedEvent | MeetOfferEvent | TaskErrorEvent |
         OutputEvent | OutputPartialEvent | TimelineLocalEvent | ExitEvent | SlotOfferEvent |
         CellEndEvent | ResizeEvent | DriverLogEvent | LinkProbeEvent | ChannelClosedEvent)
#: What the driver sends a task.
Order = (StartRankOrder | RunCellOrder | InterruptCellOrder | EndPoolOrder | DropShardsOrder |
         TakeStacksOrder | MeetOrder | ProbeLinkOrder | PreemptOrder)
#: The channel's own frames, which no queue holds.
Frame = HelloFrame | ByeFrame | BeatFrame
#: A record as the wire and the driver's queue hold it: a plain JSON object.
Wire = dict[str, Any]


def to_wire(record: Event | Order | Frame) -> Wire:
    """``record`` as the wire's dict (the same object: a record is a plain dict)."""
    return cast(Wire, record)
