"""The wire between the sides, written down once: every event kind with its fields, and every
environment variable the driver side sets for ranks.

An event is a JSON object with ``kind`` and the fields of its record (:mod:`hvd_magics.events`:
one ``TypedDict`` per kind, which says what each field holds and means; the catalogue below names
each kind, its sender and its record). The rank writes its events to a pipe
(:mod:`hvd_magics.rank.rank_events`, stamped ``rtime``); its supervisor adds what it sees itself
and forwards all of them, stamped ``rank``, ``host`` and ``time``, over the channel
(:mod:`hvd_magics.channel`) or straight onto the driver's queue (``np < 0``); the driver stamps
``recv`` on arrival and dispatches on ``kind`` (:class:`hvd_magics.job.job_state.JobState`).
Order: a rank's ``exit`` is its last event, after everything it wrote.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, BinaryIO, Final, TypeGuard, get_args
from collections.abc import Mapping

from hvd_magics.events import (BeatFrame, ByeFrame, CellEndEvent, ChannelClosedEvent,
                               DriverLogEvent, DropShardsOrder, EndPoolOrder, EpochBeginEvent,
                               EpochEndEvent, ErrorEvent, Event, ExitEvent, Frame, HelloFrame,
                               ImportedEvent, InterruptCellOrder, KeptEvent, LeavingEvent,
                               LinkProbeEvent, LogEvent, MeetOfferEvent, MeetOrder, Order,
                               OutputEvent,
                               OutputPartialEvent, PreemptCallsEvent, PreemptOrder,
                               ProbeLinkOrder, ProgressEvent, ResizeEvent, ResultEvent,
                               RunCellOrder, RunLogEvent, ShardingEvent, SlotOfferEvent, Stamps,
                               StacksEvent, StartedEvent, StartRankOrder, StepSplitEvent,
                               TakeStacksOrder, TaskErrorEvent, TaskStartedEvent,
                               TimelineChunkEvent, TimelineLocalEvent, TrackerEvent)


@dataclass(frozen=True)
class EventKind:
    """One kind of event: who sends it, and its record (:mod:`hvd_magics.events`), which says
    the fields it carries besides the stamps and what it means."""

    name: str
    sender: str
    record: Any

    @property
    def fields(self) -> tuple[str, ...]:
        """The record's own fields, in order (``kind`` and the stamps left out: a stamp's name
        is a field only where the record requires it, as a ``hello`` its ``job`` and ``rank``)."""
        return tuple(name for name in self.record.__annotations__ if name != "kind" and (
            name not in Stamps.__annotations__ or name in self.record.__required_keys__))

    @property
    def meaning(self) -> str:
        """What an event of this kind says (its record's docstring, as one line)."""
        return " ".join((self.record.__doc__ or "").split())


# -- sent by the rank process -----------------------------------------------------------------
STARTED: Final = "started"
ERROR: Final = "error"
RESULT: Final = "result"
LEAVING: Final = "leaving"
LOG: Final = "log"
RUN_LOG: Final = "run_log"
TRACKER: Final = "tracker"
EPOCH_BEGIN: Final = "epoch_begin"
PROGRESS: Final = "progress"
EPOCH_END: Final = "epoch_end"
STEP_SPLIT: Final = "step_split"
#: The columns of a ``step_split`` row after its step number (TensorFlow's rows may end after
#: ``comm_s``: the rest are zero).
STEP_COLUMNS = ("step_s", "input_s", "comm_s", "cpu_wait_s", "cpu_s", "input_cpu_wait_s",
                "input_cpu_s")
PREEMPT_CALLS: Final = "preempt_calls"
KEPT: Final = "kept"
STACKS: Final = "stacks"
IMPORTED: Final = "imported"
# -- sent by the supervisor -------------------------------------------------------------------
SHARDING: Final = "sharding"
TASK_STARTED: Final = "task_started"
TASK_ERROR: Final = "task_error"
OUTPUT: Final = "output"
OUTPUT_PARTIAL: Final = "output_partial"
TIMELINE_LOCAL: Final = "timeline_local"
TIMELINE_CHUNK: Final = "timeline_chunk"
EXIT: Final = "exit"
SLOT_OFFER: Final = "slot_offer"
MEET_OFFER: Final = "meet_offer"
# -- sent by the driver to the job's views (elastic jobs) -------------------------------------
RESIZE: Final = "resize"
DRIVER_LOG: Final = "driver_log"
# -- orders the driver sends to a task (elastic jobs, warm pools) -----------------------------
START_RANK: Final = "start_rank"
RUN_CELL: Final = "run_cell"
INTERRUPT_CELL: Final = "interrupt_cell"
END_POOL: Final = "end_pool"
DROP_SHARDS: Final = "drop_shards"
TAKE_STACKS: Final = "take_stacks"
MEET: Final = "meet"
PROBE_LINK: Final = "probe_link"
PREEMPT: Final = "preempt"
# -- sent by a warm pool's supervisor ---------------------------------------------------------
CELL_END: Final = "cell_end"
# -- the channel itself -----------------------------------------------------------------------
HELLO: Final = "hello"
BYE: Final = "bye"
BEAT: Final = "beat"
CHANNEL_CLOSED: Final = "channel_closed"
LINK_PROBE: Final = "link_probe"

EVENTS: dict[str, EventKind] = {kind.name: kind for kind in (
    EventKind(STARTED, "rank", StartedEvent),
    EventKind(ERROR, "rank", ErrorEvent),
    EventKind(RESULT, "rank", ResultEvent),
    EventKind(LEAVING, "rank", LeavingEvent),
    EventKind(LOG, "rank", LogEvent),
    EventKind(RUN_LOG, "rank", RunLogEvent),
    EventKind(TRACKER, "rank", TrackerEvent),
    EventKind(EPOCH_BEGIN, "rank", EpochBeginEvent),
    EventKind(PROGRESS, "rank", ProgressEvent),
    EventKind(EPOCH_END, "rank", EpochEndEvent),
    EventKind(STEP_SPLIT, "rank", StepSplitEvent),
    EventKind(PREEMPT_CALLS, "rank", PreemptCallsEvent),
    EventKind(KEPT, "rank", KeptEvent),
    EventKind(STACKS, "rank", StacksEvent),
    EventKind(IMPORTED, "rank", ImportedEvent),
    EventKind(SHARDING, "supervisor", ShardingEvent),
    EventKind(TASK_STARTED, "supervisor", TaskStartedEvent),
    EventKind(MEET_OFFER, "supervisor", MeetOfferEvent),
    EventKind(TASK_ERROR, "supervisor", TaskErrorEvent),
    EventKind(OUTPUT, "supervisor", OutputEvent),
    EventKind(OUTPUT_PARTIAL, "supervisor", OutputPartialEvent),
    EventKind(TIMELINE_LOCAL, "supervisor", TimelineLocalEvent),
    EventKind(TIMELINE_CHUNK, "supervisor", TimelineChunkEvent),
    EventKind(EXIT, "supervisor", ExitEvent),
    EventKind(SLOT_OFFER, "supervisor", SlotOfferEvent),
    EventKind(RESIZE, "driver", ResizeEvent),
    EventKind(DRIVER_LOG, "driver", DriverLogEvent),
    EventKind(START_RANK, "driver", StartRankOrder),
    EventKind(RUN_CELL, "driver", RunCellOrder),
    EventKind(INTERRUPT_CELL, "driver", InterruptCellOrder),
    EventKind(END_POOL, "driver", EndPoolOrder),
    EventKind(DROP_SHARDS, "driver", DropShardsOrder),
    EventKind(TAKE_STACKS, "driver", TakeStacksOrder),
    EventKind(MEET, "driver", MeetOrder),
    EventKind(PREEMPT, "driver", PreemptOrder),
    EventKind(PROBE_LINK, "driver", ProbeLinkOrder),
    EventKind(CELL_END, "supervisor", CellEndEvent),
    EventKind(HELLO, "channel", HelloFrame),
    EventKind(BYE, "channel", ByeFrame),
    EventKind(BEAT, "channel", BeatFrame),
    EventKind(LINK_PROBE, "channel", LinkProbeEvent),
    EventKind(CHANNEL_CLOSED, "channel", ChannelClosedEvent),
)}


def _kinds_of(union: Any) -> frozenset[str]:
    """The kinds whose records make up ``union``."""
    return frozenset(kind.name for kind in EVENTS.values() if kind.record in get_args(union))


#: The kinds that reach the driver's queue, the orders it sends a task, and the channel's own.
EVENT_KINDS, ORDER_KINDS, FRAME_KINDS = _kinds_of(Event), _kinds_of(Order), _kinds_of(Frame)


def is_event(wire: Mapping[str, Any]) -> TypeGuard[Event]:
    """Whether ``wire`` (a JSON object off the wire, an item of the driver's queue) is an event
    of a kind :data:`EVENTS` names; then comparing its ``kind`` with a kind's name narrows it to
    that kind's record."""
    return wire.get("kind") in EVENT_KINDS


def is_order(wire: Mapping[str, Any]) -> TypeGuard[Order]:
    """Whether ``wire`` (a frame the driver sent a task) is an order of a kind :data:`EVENTS`
    names."""
    return wire.get("kind") in ORDER_KINDS

# -- environment variables the driver side sets (or reads) for ranks --------------------------
#: The file descriptor of the pipe a rank writes its events to.
ENV_EVENT_FD = "HVD_MAGICS_EVENT_FD"
#: The file descriptor of the pipe a rank reads its supervisor's requests from (stacks).
ENV_CONTROL_FD = "HVD_MAGICS_CONTROL_FD"
#: What begins a line of that pipe that carries a ``preempt`` order (JSON) rather than a stacks
#: request.
PREEMPT_LINE = "preempt "
#: Set in the notebook: the address of its machine that the executors reach (for the live view).
ENV_DRIVER_HOST = "HVD_MAGICS_DRIVER_HOST"
#: Set to ``0`` in the notebook: no live view; output, errors and the value come back through
#: the Spark result when the job ends (for executors that cannot reach the notebook).
ENV_LIVE = "HVD_MAGICS_LIVE"
#: JSON list of the rank's DataFrame shards: ``index``, ``name``, ``path``, ``rows_per_rank``.
ENV_SHARDS = "HVD_MAGICS_SHARDS"
#: The folder Spark unpacked the notebook's shipped environment into (its archive's alias) and
#: the Python version it was packed with (:mod:`hvd_magics.launch.environment_shipping`).
ENV_SHIPPED_ENVIRONMENT = "HVD_MAGICS_SHIPPED_ENVIRONMENT"
ENV_SHIPPED_PYTHON = "HVD_MAGICS_SHIPPED_PYTHON"
#: Which attempt of a job with restarts this is (0 first) and where its checkpoints are
#: (:mod:`hvd_magics.rank.api.checkpoint`, :mod:`hvd_magics.job.restarts`).
ENV_ATTEMPT = "HVD_MAGICS_ATTEMPT"
ENV_CHECKPOINT_DIR = "HVD_MAGICS_CHECKPOINT_DIR"
#: The name of the file the driver wrote into the checkpoint folder for this attempt (a rank
#: that does not find it there does not share the driver's folder), and the global step of the
#: checkpoint every rank of the attempt resumes from (``none``: none was written).
ENV_CHECKPOINT_TOKEN = "HVD_MAGICS_CHECKPOINT_TOKEN"
ENV_RESUME_STEP = "HVD_MAGICS_RESUME_STEP"
#: Where the attempt's resume step is (``memory``: kept in the hosts' memory by
#: ``checkpoint.keep``; ``file``: a checkpoint file), the job's key among the kept steps, its
#: secret (a keeper serves a job's steps to those who say it), and the hosts holding the step with
#: their keepers' addresses (``host=address:port,...``) (hvd_magics.rank.api.keeping).
ENV_RESUME_FROM = "HVD_MAGICS_RESUME_FROM"
ENV_KEEP_JOB = "HVD_MAGICS_KEEP_JOB"
ENV_KEEP_SECRET = "HVD_MAGICS_KEEP_SECRET"
ENV_KEEP_PEERS = "HVD_MAGICS_KEEP_PEERS"
#: How many parts the kept step has (1: replicated; a sharded state's: the ranks that kept it).
ENV_KEEP_PARTS = "HVD_MAGICS_KEEP_PARTS"
#: The user's folder of kept steps on a host (default ``/dev/shm/hvd-magics-keep-<uid>``), and
#: the seconds a keeper keeps a job's steps untouched before it removes them (600).
ENV_KEEP_DIR = "HVD_MAGICS_KEEP_DIR"
#: ``1``: the libraries that train for the job (Lightning) keep every step themselves.
ENV_KEEP_STEPS = "HVD_MAGICS_KEEP_STEPS"
ENV_KEEP_IDLE_S = "HVD_MAGICS_KEEP_IDLE_S"
#: The rank's host as its task named it, and the rank's index among that host's ranks.
ENV_RANK_HOST = "HVD_MAGICS_RANK_HOST"
ENV_HOST_RANK = "HVD_MAGICS_HOST_RANK"
#: How often MLflow writes a lost tracking server missed are tried again, in seconds (a setting,
#: read when the retrying starts; :data:`hvd_magics.job.records.mlflow_run.RETRY_S` by default).
ENV_MLFLOW_RETRY_S = "HVD_MAGICS_MLFLOW_RETRY_S"
#: The interpreter a task starts its rank with (the shipped environment's; else its own).
ENV_RANK_PYTHON = "HVD_MAGICS_RANK_PYTHON"
#: Asks a rank's supervisor to record a Horovod Timeline and send it back (rank 0).
ENV_WANT_TIMELINE = "HVD_MAGICS_TIMELINE"
#: ``0`` turns off the progress callback added to every Keras ``Model.fit``.
ENV_KERAS_PROGRESS = "HVD_MAGICS_KERAS_PROGRESS"
#: ``0``: a plain DDP or Accelerate loop's progress is not inferred
#: (rank/integrations/plain_loops.py).
ENV_LOOP_PROGRESS = "HVD_MAGICS_LOOP_PROGRESS"
#: ``0``: a rank does not time its steps' input, compute and communication
#: (rank/instruments/step_split.py; the overhead benchmark's "off").
ENV_STEP_SPLIT = "HVD_MAGICS_STEP_SPLIT"
#: Seconds a host's rank supervisors may be silent before the driver takes the host for lost
#: (hvd_magics.job.runner.HOST_SILENT_S by default); read in the notebook's process.
ENV_HOST_SILENT = "HVD_MAGICS_HOST_SILENT_S"
#: How many attempts of one job may end on a preemption notice (hvd_magics.job.restarts).
ENV_MAX_PREEMPTIONS = "HVD_MAGICS_MAX_PREEMPTIONS"
#: Seconds rank 0 may take to write a preemption notice's checkpoint after the other ranks
#: ended on it (hvd_magics.job.runner).
ENV_NOTICE_SAVE_WAIT = "HVD_MAGICS_NOTICE_SAVE_WAIT_S"
#: Raises the size limit (MB) of the values a job sends back to the notebook.
ENV_MAX_RESULT_MB = "HVD_MAGICS_MAX_RESULT_MB"
#: ``"1"``: every rank sends its value back, not only rank 0 (``@distributed``'s list of them).
ENV_EVERY_RESULT = "HVD_MAGICS_EVERY_RESULT"
#: Set to ``1`` by default: ``tf.keras`` is Keras 2 (tf_keras), which Horovod's Keras API needs.
ENV_LEGACY_KERAS = "TF_USE_LEGACY_KERAS"
#: The threads of a rank's OpenMP pool (PyTorch's intra-op threads, NumPy's BLAS): its share of
#: its host's or task's cores unless the job's ``--env`` sets it (task/threads.py).
ENV_OMP_THREADS = "OMP_NUM_THREADS"
#: The frameworks a HorovodEstimator trains (its fit's result and its model say which).
KERAS, TORCH = "keras", "torch"
#: How a fitted classifier's output becomes probabilities (its fit's result says which, and
#: ``transform`` follows it): already probabilities, logits of several classes, one logit, or
#: log-probabilities.
OUTPUT_PROBABILITY, OUTPUT_SOFTMAX, OUTPUT_SIGMOID, OUTPUT_EXP = (
    "probability", "softmax", "sigmoid", "exp")
#: Horovod's own: where rank 0 writes the timeline, and whether it marks cycles.
ENV_HOROVOD_TIMELINE = "HOROVOD_TIMELINE"
ENV_TIMELINE_MARK_CYCLES = "HOROVOD_TIMELINE_MARK_CYCLES"
#: ``HOROVOD_TIMELINE`` of a warm pool's ranks: nothing recorded until ``hvd.start_timeline``.
TIMELINE_DYNAMIC = "DYNAMIC"
#: Horovod's own: seconds before its coordinator warns of tensors some ranks never submitted.
ENV_STALL_CHECK = "HOROVOD_STALL_CHECK_TIME_SECONDS"
#: CUDA's device list: the GPUs a rank sees.
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
#: Horovod's own: the port of the Gloo rendezvous (known only once the tasks met).
ENV_RENDEZVOUS_PORT = "HOROVOD_GLOO_RENDEZVOUS_PORT"
#: Comma-separated modules a rank imports while it waits for its job (the leading imports of the
#: cell or function), so that importing overlaps the rest of the launch.
ENV_PREIMPORT = "HVD_MAGICS_PREIMPORT"
#: The private temporary folder the supervisor made for a rank (its keeper tidies it).
ENV_RANK_TMPDIR = "HVD_MAGICS_RANK_TMPDIR"
#: Horovod's own: set for the ranks of an elastic job (``hvd.elastic`` reads it).
ENV_HOROVOD_ELASTIC = "HOROVOD_ELASTIC"
#: The line a warm pool's rank prints after a cell's output; its supervisor sends ``cell_end``
#: in its place (so the end of a cell follows every line the cell printed).
CELL_END_LINE = "\x1ehvd_magics cell end\x1e"
#: The engine a job's ranks run on (``horovod``, ``torch`` or ``tf``), set for every rank.
ENV_ENGINE = "HVD_MAGICS_ENGINE"
ENGINE_HOROVOD, ENGINE_TORCH, ENGINE_TF = "horovod", "torch", "tf"
ENGINES = (ENGINE_HOROVOD, ENGINE_TORCH, ENGINE_TF)
#: The rank of a rank process and the number of ranks, whatever its engine.
ENV_RANK, ENV_SIZE = "HVD_MAGICS_RANK", "HVD_MAGICS_SIZE"
#: What ``torch.distributed``'s ``env://`` initialisation reads (as torchrun sets it), and what
#: ``tf.distribute.MultiWorkerMirroredStrategy`` reads.
ENV_MASTER_ADDR, ENV_MASTER_PORT = "MASTER_ADDR", "MASTER_PORT"
ENV_TF_CONFIG = "TF_CONFIG"
#: torchrun's own names, which ``init_process_group()`` and the libraries on it read.
ENV_TORCH_RANK, ENV_WORLD_SIZE = "RANK", "WORLD_SIZE"
ENV_LOCAL_RANK, ENV_LOCAL_WORLD_SIZE, ENV_GROUP_RANK = (
    "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")
#: torchrun's number of nodes, and the node's rank as Lightning and Accelerate read it.
ENV_GROUP_WORLD_SIZE, ENV_NODE_RANK = "GROUP_WORLD_SIZE", "NODE_RANK"
#: Gloo's interface under torch.distributed (its own choice may pick one other hosts cannot reach).
ENV_GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"
#: Horovod's own names for a rank's place, its Gloo rendezvous and its controller.
ENV_HOROVOD_HOSTNAME, ENV_HOROVOD_RANK, ENV_HOROVOD_SIZE = (
    "HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE")
ENV_HOROVOD_LOCAL_RANK, ENV_HOROVOD_LOCAL_SIZE = "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"
ENV_HOROVOD_CROSS_RANK, ENV_HOROVOD_CROSS_SIZE = "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE"
ENV_RENDEZVOUS_ADDR = "HOROVOD_GLOO_RENDEZVOUS_ADDR"
ENV_HOROVOD_CONTROLLER, ENV_HOROVOD_CPU_OPERATIONS = "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS"
ENV_HOROVOD_GLOO_IFACE = "HOROVOD_GLOO_IFACE"
#: Horovod's own: how long a Gloo operation waits for a peer (its default is 30 s).
ENV_GLOO_TIMEOUT = "HOROVOD_GLOO_TIMEOUT_SECONDS"
#: Our Horovod build's bound, in milliseconds, on the background loop's wait while a rank has
#: nothing to negotiate (``0``: a cycle every ``HOROVOD_CYCLE_TIME``, as Horovod does;
#: :mod:`hvd_magics.horovod.patches`, change 11).
ENV_HOROVOD_IDLE_WAIT = "HVD_MAGICS_HOROVOD_IDLE_WAIT_MS"
#: Where shard files go, when set (else ``$TMPDIR/hvd_magics/shards``).
ENV_SHARD_DIR = "HVD_MAGICS_SHARD_DIR"
#: The driver's environment variable that sets how many run folders are kept.
ENV_KEEP_RUNS = "HVD_MAGICS_KEEP_RUNS"
#: TensorFlow's C++ log level (``3`` keeps its start-up lines off stderr).
ENV_TF_LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
#: What Spark's Python workers run, and the driver's Python.
ENV_PYSPARK_PYTHON, ENV_PYSPARK_DRIVER_PYTHON = "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"
#: The module a rank process runs (``python -m``).
RANK_MODULE = "hvd_magics.rank.rank_main"

# -- a zygote: a process that imported a job's frameworks once and forks ranks ----------------
#: The module a zygote runs (``python -m``; hvd_magics.rank.zygote).
ZYGOTE_MODULE = "hvd_magics.rank.zygote"
#: ``0`` starts every rank as a fresh interpreter (no zygote), on the driver or in a task;
#: ``1`` starts ranks from zygotes also in a YARN container (off there by default).
ENV_ZYGOTE = "HVD_MAGICS_ZYGOTE"
#: Set by YARN's NodeManager in every container it starts (an executor's, on YARN).
ENV_YARN_CONTAINER = "CONTAINER_ID"
#: Seconds a zygote without a rank to start waits before it ends (default 600).
ENV_ZYGOTE_IDLE_S = "HVD_MAGICS_ZYGOTE_IDLE_S"
#: The folder of this host's zygote sockets (default: ``hvd-magics-zygotes-<uid>`` in the
#: temporary folder; it must be the user's own and closed to others, or no zygote is used).
ENV_ZYGOTE_DIR = "HVD_MAGICS_ZYGOTE_DIR"
#: Set for the zygote process only: the socket path it serves, the file descriptor of the lock
#: it holds until it serves there, and the comma-separated modules it imports first.
ENV_ZYGOTE_SOCKET, ENV_ZYGOTE_LOCK_FD = "HVD_MAGICS_ZYGOTE_SOCKET", "HVD_MAGICS_ZYGOTE_LOCK_FD"
ENV_ZYGOTE_IMPORTS = "HVD_MAGICS_ZYGOTE_IMPORTS"
#: The process id of the supervisor that started a rank (a rank forked from a zygote is not a
#: descendant of it).
ENV_SUPERVISOR_PID = "HVD_MAGICS_SUPERVISOR_PID"
#: What a zygote says to each process that connects (then the frameworks of ZYGOTE_MODULES it
#: holds, comma-separated); what it says to them when it takes no more ranks (it was replaced
#: by a zygote that imports more, or a module it imported changed on disk); and what asks it
#: for a zygote that imports more (then the modules), which then serves at its path.
ZYGOTE_READY, ZYGOTE_RETIRE, ZYGOTE_GROW = b"ready", b"retire", b"grow "
#: What a zygote's keeper tells its supervisor besides ``pid N`` and ``exit CODE``: that it was
#: stopped (SIGTERM) before its rank ended, and why: the zygote that forked it ended, or
#: something else sent it SIGTERM. A keeper that says none of these was killed outright.
KEEPER_STOPPED, KEEPER_PARENT_GONE, KEEPER_TERMINATED = "stopped", "parent-gone", "sigterm"
#: The only modules a zygote imports, in this order: installed frameworks that take a second or
#: more to import. Never the user's own modules, which may change between jobs.
ZYGOTE_MODULES = ("numpy", "pandas", "pyarrow", "scipy", "sklearn", "torch", "torchvision",
                  "horovod.torch", "tensorflow", "tf_keras", "keras", "horovod.tensorflow",
                  "horovod.tensorflow.keras", "horovod.keras", "transformers", "accelerate",
                  "lightning", "pytorch_lightning", "mlflow")
#: What a framework imports lazily in nearly every job, which a zygote that imports the framework
#: imports too: PyTorch's first optimizer imports ``torch._dynamo`` (0.8 CPU s in every rank
#: forked from a zygote without it), a rank's fresh seeding ``numpy.random``.
ZYGOTE_COMPANIONS = {"numpy": ("numpy.random",), "torch": ("torch._dynamo",)}
#: The environment variables a rank's framework reads only once the job runs, so ranks that
#: differ only in these start from one zygote (any other difference: a zygote of their own).
#: pytest's variables (``PYTEST_CURRENT_TEST``, its lanes') are read by nothing on import;
#: ``TMPDIR`` is read again in a forked rank (and a rank gets a temporary folder of its own).
#: Spark's variables for its Python workers (an application's folders and secret) and a
#: kernel's (``JPY_``) are read by nothing on import either: a host's ranks share zygotes across
#: Spark applications and kernels.
#: What importing TensorFlow sets in the process that imports it (a supervisor that imported it
#: passes them on; a zygote that imports it sets them itself), what torch reads only when
#: called, and the telemetry session mlflow draws in each process importing it, are late too.
ZYGOTE_LATE_ENV_PREFIXES = ("HOROVOD_", "HVD_MAGICS_", "SPARK_", "PYSPARK_", "_PYSPARK_",
                            "PYTHON_WORKER_", "PYTHON_DAEMON_", "PYTHON_UDF_", "JPY_", "PYTEST_",
                            "TPU_ML_PLATFORM")
ZYGOTE_LATE_ENV = (ENV_MASTER_ADDR, ENV_MASTER_PORT, ENV_TF_CONFIG, ENV_TORCH_RANK, ENV_WORLD_SIZE,
                   ENV_LOCAL_RANK, ENV_LOCAL_WORLD_SIZE, ENV_GROUP_RANK, ENV_GROUP_WORLD_SIZE,
                   ENV_NODE_RANK, ENV_GLOO_SOCKET_IFNAME, CUDA_VISIBLE_DEVICES,
                   "PWD", "OLDPWD", "SHLVL", "_", "TMPDIR", "COLUMNS", "LINES",
                   "TF2_BEHAVIOR", "ENABLE_RUNTIME_UPTIME_TELEMETRY", "HDF5_PLUGIN_PATH",
                   "KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK", "TORCHINDUCTOR_CACHE_DIR",
                   "PYTORCH_NVML_BASED_CUDA_CHECK", "_MLFLOW_TELEMETRY_SESSION_ID")

# -- the columns that carry a job's DataFrames to its barrier stage -----------------------------
#: ``__source`` is the DataFrame's index, ``__key`` sends the row to its task, ``__s<index>``
#: holds the row's columns as a struct (see hvd_magics.launch.dataframe_input).
SOURCE_COLUMN, KEY_COLUMN, ROW_COLUMN, ORDER_COLUMN = "__source", "__key", "__s{}", "__order"


# -- building Horovod (hvd_magics.horovod.build)
# ----------------------------------------------------
#: Where built Horovod wheels and their logs are kept (default ``~/.cache/hvd_magics``).
ENV_CACHE = "HVD_MAGICS_CACHE"
#: Where CUDA is, when ``nvcc`` is not on the PATH.
CUDA_HOME_VARIABLES = ("CUDA_HOME", "CUDA_PATH")
#: Horovod's build switches: which collectives libraries and frameworks it builds with.
HOROVOD_BUILD_ALWAYS = {"HOROVOD_WITH_GLOO": "1", "HOROVOD_WITHOUT_MPI": "1",
                        "HOROVOD_WITHOUT_MXNET": "1"}
#: Per framework: the switch that builds Horovod with it, and the one that builds without.
HOROVOD_BUILD_FRAMEWORK = {"tensorflow": ("HOROVOD_WITH_TENSORFLOW", "HOROVOD_WITHOUT_TENSORFLOW"),
                           "torch": ("HOROVOD_WITH_PYTORCH", "HOROVOD_WITHOUT_PYTORCH")}
ENV_GPU_OPERATIONS = "HOROVOD_GPU_OPERATIONS"


# -- what a supervisor writes to its rank's stdin -----------------------------------------------
def encode_job(payload: bytes, late_env: dict[str, str]) -> bytes:
    """One frame of a rank's stdin: 4 bytes (big-endian) giving the length of a JSON object of
    environment variables known only at delivery (the rendezvous port, say), that object, 8 bytes
    giving the payload's length, then the cloudpickled ``(main, kwargs)``. A cold job's rank reads
    one frame; a pool's rank reads one per cell until its stdin ends."""
    env = json.dumps(late_env).encode()
    return len(env).to_bytes(4, "big") + env + len(payload).to_bytes(8, "big") + payload


def decode_job(stream: BinaryIO) -> tuple[dict[str, str], bytes] | None:
    """Read one frame :func:`encode_job` wrote: ``(late_env, payload)``; ``None`` at the end of
    the stream (a pool that stops)."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    late_env = json.loads(stream.read(int.from_bytes(head, "big")) or b"{}")
    size = int.from_bytes(stream.read(8), "big")
    return late_env, stream.read(size)


#: How a rank's line that a PyTorch extension's first build begins starts (DeepSpeed's CPU
#: ops: half a minute to minutes without a word): the driver's stall notice reads it.
FIRST_BUILD = "hvd_magics: building the PyTorch extension"
