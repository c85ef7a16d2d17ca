"""``@distributed``: Databricks' serverless GPU decorator (``serverless_gpu.distributed``, and
``databricks.air.distributed`` of AI Runtime), on any Spark cluster or on the driver.

Decorate a training function, then call ``train.distributed(...)``: it runs on every rank with
torchrun's environment (as :class:`hvd_magics.TorchDistributor` runs it), with the dashboard,
rank-labelled errors, restarts and shards of any job of ours, and returns every rank's value in
rank order. Calling ``train(...)`` itself runs it here, once, as a plain function.
"""
from __future__ import annotations

import functools
from typing import Any
from collections.abc import Callable

from hvd_magics.dropins.torch_distributor import TorchDistributor, task_gpu_amount
from hvd_magics.notices import say
from hvd_magics.protocol import ENV_EVERY_RESULT
from hvd_magics.task.gpus import local_gpu_count


class DistributedFunction:
    """A function decorated with :func:`distributed`: call it to run it here, or call its
    :meth:`distributed` to run it on every rank."""

    def __init__(self, function: Callable[..., Any], processes: int | None, remote: bool,
                 gpu_type: str | None, options: dict[str, Any]) -> None:
        functools.update_wrapper(self, function)
        self.function = function
        self.processes = processes
        self.remote = remote
        #: Accepted as Databricks takes it; the GPUs are the cluster's (not checked).
        self.gpu_type = gpu_type
        self.options = options

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def distributed(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Run the function on every rank as ``function(*args, **kwargs)``.

        Returns
        -------
        list
            What it returned on each rank, in rank order.

        Raises
        ------
        HorovodJobError
            When a rank failed (the first line names it).
        """
        processes, use_gpu = self._layout()
        options = {**self.options,
                   "env": {**self.options.get("env", {}), ENV_EVERY_RESULT: "1"}}
        distributor = TorchDistributor(num_processes=processes, local_mode=not self.remote,
                                       use_gpu=use_gpu, **options)
        return distributor.run_record(self.function, *args, **kwargs).values or []

    def _layout(self) -> tuple[int, bool]:
        """``(processes, use_gpu)``: a process per GPU where the ranks run (the driver's, or each
        Spark task's), or ``processes`` on CPU where there is none."""
        gpus = self._gpus_where_ranks_run()
        if self.processes is None and self.remote:
            raise ValueError("@distributed(remote=True) runs on the cluster's executors, whose "
                             "GPUs the driver cannot count. Fix: @distributed(gpus=N, "
                             "remote=True) for N processes.")
        processes = self.processes if self.processes is not None else gpus
        if processes < 1:
            raise ValueError("@distributed() runs a process per GPU of the driver, and it has "
                             "none. Fix: @distributed(gpus=N) for N processes (on CPU where "
                             "there is no GPU).")
        if not gpus:
            say(f"no GPU where the ranks run: {processes} process"
                f"{'es' if processes != 1 else ''} on CPU (use the 'gloo' backend)")
        return processes, bool(gpus)

    def _gpus_where_ranks_run(self) -> int:
        if not self.remote:
            return local_gpu_count()
        return int(task_gpu_amount()[1])


def distributed(function: Callable[..., Any] | None = None, *, gpus: int | None = None,
                gpu_type: str | None = None, remote: bool = False,
                num_accelerators: int | None = None, **options: Any) -> Any:
    """Decorate a training function so that ``train.distributed(...)`` runs it on every rank,
    as Databricks' serverless GPU ``@distributed`` does.

    Parameters
    ----------
    gpus, num_accelerators : int, optional
        How many processes (a rank per GPU; ``num_accelerators`` is AI Runtime's name). Left
        out: a process per GPU of the driver (``remote=True`` needs it given). Where the ranks
        have no GPU, this many processes run on CPU.
    gpu_type : str, optional
        Accepted for Databricks' code; the GPUs are those of the cluster.
    remote : bool
        ``False``: the ranks are processes on the driver (the node the notebook runs on).
        ``True``: one Spark barrier task each (a task per GPU, as ``TorchDistributor`` runs
        them), on the session's executors.
    **options
        What :class:`hvd_magics.HorovodRunner` takes besides ``np`` and ``engine``
        (``timeout``, ``restarts``, ``env``, ``mlflow``, ...).

    Examples
    --------
    >>> @distributed(gpus=2, remote=True)                        # doctest: +SKIP
    ... def train(learning_rate):
    ...     import torch.distributed as dist
    ...     dist.init_process_group("gloo")      # "nccl" on GPUs
    ...     ...
    ...     return dist.get_rank()
    >>> train.distributed(1e-3)                                  # doctest: +SKIP
    [0, 1]
    """
    if gpus is not None and num_accelerators is not None and gpus != num_accelerators:
        raise ValueError(f"gpus={gpus} and num_accelerators={num_accelerators} disagree: "
                         "give one of them")
    processes = gpus if gpus is not None else num_accelerators
    if processes is not None and (isinstance(processes, bool) or not isinstance(processes, int)
                                  or processes < 1):
        raise ValueError(f"gpus must be a positive whole number, got {processes!r}")
    for taken in ("np", "engine", "num_processes", "local_mode", "use_gpu"):
        if taken in options:
            raise ValueError(f"@distributed sets {taken} itself; leave it out")

    def decorate(target: Callable[..., Any]) -> DistributedFunction:
        if not callable(target):
            raise TypeError(f"@distributed decorates a function, got {type(target).__name__}")
        return DistributedFunction(target, processes, bool(remote), gpu_type, options)

    return decorate(function) if function is not None else decorate
