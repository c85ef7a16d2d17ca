"""A drop-in for pyspark's ``DeepspeedTorchDistributor``
(``pyspark.ml.deepspeed.deepspeed_distributor``): the same constructor and ``run``, run as a job
of ours on the ``torch`` engine (the dashboard, stacks, restarts, rank-labelled errors and
DataFrame shards come with it).

Change ``from pyspark.ml.deepspeed.deepspeed_distributor import DeepspeedTorchDistributor`` to
``from hvd_magics import DeepspeedTorchDistributor`` and nothing else. As pyspark's, a function
is called on every rank (``deepspeed.initialize`` there reads the job's torchrun environment),
and a file is run with ``--deepspeed --deepspeed_config PATH`` after its own arguments.
"""
from __future__ import annotations

from typing import Any, ClassVar
from collections.abc import Callable

from hvd_magics.dropins.torch_distributor import TorchDistributor
from hvd_magics.launch.encryption import DEEPSPEED_IGNORE_SSL
from hvd_magics.rank.integrations.deepspeed import run_deepspeed_script


class DeepspeedTorchDistributor(TorchDistributor):
    """Run a DeepSpeed training function or file on ``numGpus * nnodes`` ranks, as pyspark's
    ``DeepspeedTorchDistributor`` does.

    Parameters
    ----------
    numGpus : int
        Processes per node (DeepSpeed's ``--num_gpus``): a rank per GPU (``True`` is 1, as
        pyspark takes it).
    nnodes : int
        Nodes.
    localMode : bool
        ``True``: the ranks are processes on the driver; ``False``: Spark barrier tasks.
    useGpu : bool
        Train on GPUs (as :class:`hvd_magics.TorchDistributor`'s ``use_gpu``); ``False`` trains
        on CPU, where DeepSpeed (0.19) takes its CPU accelerator and the ``gloo`` backend.
    deepspeedConfig : str or dict, optional
        The DeepSpeed configuration a file is run with: a JSON file's path, or a dict (written
        to a file on each rank's host). ``None``: DeepSpeed's defaults.
    **options
        What :class:`hvd_magics.HorovodRunner` takes besides ``np`` and ``engine``
        (``timeout``, ``restarts``, ``env``, ``mlflow``, ...).

    On Spark tasks of a session with ``spark.ssl.enabled=true``, ``run`` is refused
    (``EncryptionRequired``) unless ``deepspeed.spark.distributor.ignoreSsl`` is ``true``, as
    pyspark's (its own setting, not ``TorchDistributor``'s). ``input_params`` holds
    ``deepspeed_config`` besides :class:`~hvd_magics.TorchDistributor`'s.

    Examples
    --------
    >>> def train(learning_rate):                                   # doctest: +SKIP
    ...     import deepspeed
    ...     # rest of training function
    ...     return model
    >>> distributor = DeepspeedTorchDistributor(numGpus=4, nnodes=1, useGpu=True,
    ...                                         localMode=True,
    ...                                         deepspeedConfig="path/to/config.json")
    >>> output = distributor.run(train, 0.01)                       # doctest: +SKIP
    """

    _NAMES: ClassVar[dict[str, str]] = {"use_gpu": "useGpu", "num_processes": "numGpus * nnodes"}
    _IGNORE_SSL: ClassVar[str] = DEEPSPEED_IGNORE_SSL

    def __init__(self, numGpus: int = 1, nnodes: int = 1, localMode: bool = True,
                 useGpu: bool = True, deepspeedConfig: str | dict[str, Any] | None = None,
                 **options: Any) -> None:
        for name, value in (("numGpus", numGpus), ("nnodes", nnodes)):
            # a bool is taken as the number it is (numGpus=True: 1), as pyspark takes it
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive whole number, got {value!r}")
        if deepspeedConfig is not None and not isinstance(deepspeedConfig, (str, dict)):
            raise TypeError("deepspeedConfig must be a JSON file's path, a dict or None, got "
                            f"{type(deepspeedConfig).__name__}")
        self.deepspeed_config = deepspeedConfig
        super().__init__(num_processes=int(numGpus) * int(nnodes), local_mode=localMode,
                         use_gpu=useGpu, **options)

    def _input_params(self) -> dict[str, Any]:
        return {**super()._input_params(), "deepspeed_config": self.deepspeed_config}

    def _script_job(self, path: str, argv: list[str]) -> tuple[Callable[..., Any], dict]:
        return run_deepspeed_script, {"path": path, "argv": argv,
                                      "config": self.deepspeed_config}
