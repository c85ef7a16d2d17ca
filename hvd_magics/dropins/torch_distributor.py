"""A drop-in for pyspark's ``TorchDistributor``: the same constructor, ``run`` and return value,
run as a job of ours on the ``torch`` engine (the dashboard, rank-labelled errors, epoch timing,
MLflow and DataFrame shards come with it).

Change ``from pyspark.ml.torch.distributor import TorchDistributor`` to
``from hvd_magics import TorchDistributor`` and nothing else.
"""
from __future__ import annotations

import inspect
import os
import warnings
from typing import Any, ClassVar
from collections.abc import Callable, Mapping

from hvd_magics.job.records.run_record import RunRecord
from hvd_magics.job.runner import HorovodRunner, source_of
from hvd_magics.launch.encryption import IGNORE_SSL
from hvd_magics.launch.payload import function_references, serialize_job
from hvd_magics.launch.spark_session import active_session
from hvd_magics.launch.spark_slots import TASK_GPU_AMOUNT
from hvd_magics.protocol import CUDA_VISIBLE_DEVICES, ENGINE_TORCH
from hvd_magics.rank.torch_entry import call_with, run_script
from hvd_magics.task.gpus import local_gpu_count

#: The Spark setting that gives the driver its GPUs, which bounds ``num_processes`` on the
#: driver with ``use_gpu=True`` (as in pyspark).
DRIVER_GPU_AMOUNT = "spark.driver.resource.gpu.amount"


class TorchDistributor:
    """Run a PyTorch training function or file on ``num_processes`` ranks, as pyspark's
    ``TorchDistributor`` does, with the ranks' ``torch.distributed`` environment set as torchrun
    sets it (``init_process_group()`` needs no arguments besides the backend).

    Parameters
    ----------
    num_processes : int
        How many ranks (processes).
    local_mode : bool
        ``True``: the ranks are processes on the driver; ``False``: one Spark barrier task each.
    use_gpu : bool
        Train on GPUs: on the driver, each rank sees every GPU and picks its own with
        ``LOCAL_RANK``, and no more processes run than ``spark.driver.resource.gpu.amount``
        when the session sets it (fewer, with a warning, as pyspark); on Spark, each task holds
        the GPUs of ``spark.task.resource.gpu.amount`` and runs a rank per GPU
        (``num_processes`` a multiple of it), as pyspark does. ``False`` trains on CPU (the
        ``gloo`` backend), a rank per Spark task; ranks on the driver see its
        ``CUDA_VISIBLE_DEVICES`` as it is.
    **options
        What :class:`hvd_magics.HorovodRunner` takes besides ``np`` and ``engine``
        (``start_timeout``, ``env``, ``mlflow``, ``timeout``, ``stall_after``,
        ``driver_log_verbosity``, and ``restarts``, ``checkpoint_dir``, ``fresh``: start again
        after a lost rank or executor, resuming from ``hvd_magics.checkpoint``).

    Attributes
    ----------
    input_params : dict
        ``num_processes``, ``local_mode``, ``use_gpu`` and ``num_tasks``, as pyspark's.
    num_tasks : int
        The Spark tasks the job runs on.

    Raises
    ------
    ValueError
        For a ``num_processes`` that is not a positive whole number, or a wrong option.
    RuntimeError
        With ``use_gpu=True``, when the ranks would have no GPU (the driver has none, or
        ``spark.task.resource.gpu.amount`` is unset) or ``num_processes`` does not fill the
        tasks' GPUs: here, as pyspark raises it, naming the fix.

    Examples
    --------
    >>> def train(learning_rate):                               # doctest: +SKIP
    ...     import torch.distributed as dist
    ...     dist.init_process_group(backend="gloo")
    ...     ...
    ...     return model
    >>> model = TorchDistributor(num_processes=2, local_mode=True,
    ...                          use_gpu=False).run(train, 1e-3)  # doctest: +SKIP
    """

    def __init__(self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True,
                 **options: Any) -> None:
        if isinstance(num_processes, bool) or not isinstance(num_processes, int) or \
                num_processes <= 0:
            raise ValueError(f"num_processes must be a positive whole number, got "
                             f"{num_processes!r}")
        self.num_processes = num_processes
        self.local_mode = bool(local_mode)
        self.use_gpu = bool(use_gpu)
        for taken in ("np", "engine", "pool"):
            if taken in options:
                raise ValueError(f"TorchDistributor sets {taken} itself; leave it out")
        self.options = options
        # the options are checked now, as pyspark checks its own
        self._runner()
        #: Spark tasks the job runs on (pyspark's attribute): ``num_processes`` over the GPUs a
        #: task holds with ``use_gpu`` on Spark, else ``num_processes``. The GPUs are checked
        #: here, as pyspark checks them.
        self.num_tasks = self._check_gpus()
        #: What the distributor was made with, as pyspark's ``input_params`` holds it.
        self.input_params: dict[str, Any] = self._input_params()

    def _input_params(self) -> dict[str, Any]:
        return {"num_processes": self.num_processes, "local_mode": self.local_mode,
                "use_gpu": self.use_gpu, "num_tasks": self.num_tasks}

    #: The setting that allows a job on Spark tasks of a session with ``spark.ssl.enabled=true``
    #: (:mod:`hvd_magics.launch.encryption`): pyspark's, for this class.
    _IGNORE_SSL: ClassVar[str] = IGNORE_SSL

    def _runner(self) -> HorovodRunner:
        np = -self.num_processes if self.local_mode else self.num_processes
        # as pyspark: with GPUs, a task holds spark.task.resource.gpu.amount of them and runs a
        # process per GPU (the default layout); without, a process per task
        layout = {} if self.use_gpu or self.local_mode else {"ranks_per_task": 1}
        options = {**layout, **self.options}
        env = options.get("env")
        if self.local_mode and not self.use_gpu and CUDA_VISIBLE_DEVICES in os.environ and \
                (env is None or isinstance(env, Mapping)):
            # as pyspark: ranks on the driver that train on CPU see its GPUs as they are (the
            # driver's ranks would otherwise get one each)
            options["env"] = {CUDA_VISIBLE_DEVICES: os.environ[CUDA_VISIBLE_DEVICES],
                              **(env or {})}
        runner = HorovodRunner(np, engine=ENGINE_TORCH, **options)
        runner.ignore_ssl = self._IGNORE_SSL
        return runner

    #: How the constructor spells its GPU and process-count arguments (in its errors).
    _NAMES: ClassVar[dict[str, str]] = {"use_gpu": "use_gpu", "num_processes": "num_processes"}

    def _check_gpus(self) -> int:
        """``use_gpu=True`` needs GPUs where the ranks run; say how to get them or train on
        CPU (pyspark raises here too). Return the number of Spark tasks (pyspark's
        ``_get_num_tasks``)."""
        if not self.use_gpu:
            return self.num_processes
        use_gpu, processes = self._NAMES["use_gpu"], self._NAMES["num_processes"]
        cpu_fix = f"or {use_gpu}=False to train on CPU (the 'gloo' backend)"
        if self.local_mode:
            self._fit_driver_gpus(cpu_fix)
            return self.num_processes
        amount, gpus = session_number(TASK_GPU_AMOUNT)
        if gpus < 1 or not gpus.is_integer():
            what = "unset" if gpus == 0 else f"{amount}"
            raise RuntimeError(f"{use_gpu}=True, but {TASK_GPU_AMOUNT} is {what}: each Spark "
                               f"task runs a rank per GPU it holds. Fix: set {TASK_GPU_AMOUNT}=1 "
                               f"(or more, with the executors' GPU resources), {cpu_fix}.")
        if self.num_processes % int(gpus):
            raise RuntimeError(f"{use_gpu}=True with {TASK_GPU_AMOUNT}={amount}: each Spark task "
                               f"runs {int(gpus)} processes, and {processes}="
                               f"{self.num_processes} is not a multiple of that. Fix: "
                               f"{processes}={max(self.num_processes // int(gpus), 1) * int(gpus)}"
                               ".")
        return self.num_processes // int(gpus)

    def _fit_driver_gpus(self, cpu_fix: str) -> None:
        """On the driver: refuse when it has no GPU; run no more processes than the GPUs the
        session gives it (``spark.driver.resource.gpu.amount``), saying so once, as pyspark."""
        use_gpu, processes = self._NAMES["use_gpu"], self._NAMES["num_processes"]
        driver_gpus = int(session_number(DRIVER_GPU_AMOUNT)[1])
        if not (driver_gpus or local_gpu_count() or os.environ.get(CUDA_VISIBLE_DEVICES)):
            raise RuntimeError(f"{use_gpu}=True, but the driver has no GPU. Fix: run on a "
                               f"machine with GPUs, {cpu_fix}.")
        if 0 < driver_gpus < self.num_processes:
            warnings.warn(f"hvd_magics: {processes}={self.num_processes} is more than the "
                          f"driver's GPUs ({DRIVER_GPU_AMOUNT}={driver_gpus}): running "
                          f"{driver_gpus} processes, a GPU each, as pyspark does.",
                          RuntimeWarning, stacklevel=4)
            self.num_processes = driver_gpus

    def run(self, train_object: Callable[..., Any] | str | os.PathLike, *args: Any,
            **kwargs: Any) -> Any:
        """Run ``train_object`` on every rank.

        Parameters
        ----------
        train_object : callable or str
            A function, called as ``train_object(*args, **kwargs)``; or the path of a Python
            file, run as ``python path *args`` (the arguments are its command line).

        Returns
        -------
        object or None
            What the function returned on rank 0; ``None`` for a file.

        Raises
        ------
        EncryptionRequired
            On Spark tasks (``local_mode=False``) of a session with ``spark.ssl.enabled=true``,
            unless ``pytorch.spark.distributor.ignoreSsl`` is ``true`` there (as pyspark).
        HorovodJobError
            When a rank failed (the first line names it).
        """
        return self.run_record(train_object, *args, **kwargs).value

    def _script_job(self, path: str, argv: list[str]) -> tuple[Callable[..., Any], dict]:
        """What each rank runs for the file ``path`` with the command line ``argv``."""
        return run_script, {"path": path, "argv": argv}

    def run_record(self, train_object: Callable[..., Any] | str | os.PathLike, *args: Any,
                   **kwargs: Any) -> RunRecord:
        """Run ``train_object`` as :meth:`run` does; return the job's :class:`RunRecord`."""
        runner = self._runner()
        if isinstance(train_object, (str, os.PathLike)):
            if kwargs:
                raise ValueError("a file takes command-line arguments only: pass them as "
                                 "strings after the path, not as keywords")
            path = os.path.abspath(train_object) if os.path.exists(train_object) else str(
                train_object)
            if self.local_mode and not os.path.isfile(path):
                raise FileNotFoundError(f"no Python file at {train_object!r} on the driver")
            payload = serialize_job(*self._script_job(path, [str(a) for a in args]))
            record = runner.run_payload(payload, source=_file_source(path))
            record.value = None
            return record
        if not callable(train_object):
            raise TypeError("train_object must be a function or the path of a Python file, got "
                            f"{type(train_object).__name__}")
        name = getattr(train_object, "__name__", "train")
        references = {k: v for k, v in function_references(train_object).items()
                      if not inspect.ismodule(v)}
        arguments = {**{f"argument {i + 1}": a for i, a in enumerate(args)},
                     **{f"argument {k!r}": v for k, v in kwargs.items()}}
        payload = serialize_job(
            call_with, {"function": train_object, "args": args, "kwargs": kwargs},
            names={**references, **{f"args[{i}]": a for i, a in enumerate(args)}, **kwargs},
            labels={**arguments, **{f"variable {k!r} used by {name}()": v
                                    for k, v in references.items()}})
        return runner.run_payload(payload, source=source_of(train_object))


def session_number(key: str) -> tuple[str, float]:
    """The active session's setting ``key`` (``spark.task.resource.gpu.amount``, say), as set
    (``"0"`` when unset or without a session) and as a number (0 when it is not one)."""
    session = active_session()
    amount = session.conf.get(key, "0") if session is not None else "0"
    try:
        return amount, float(amount)
    except (TypeError, ValueError):
        return amount, 0.0


def task_gpu_amount() -> tuple[str, float]:
    """``spark.task.resource.gpu.amount`` of the active session (:func:`session_number`)."""
    return session_number(TASK_GPU_AMOUNT)


def _file_source(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as file:
            return file.read()
    except OSError:
        return None
