"""pyspark's own tests of ``TorchDistributor`` and ``DeepspeedTorchDistributor`` (pyspark 4.3's
``pyspark/ml/torch/tests/test_distributor.py`` and ``pyspark/ml/deepspeed/tests/
test_deepspeed_distributor.py``), run against pyspark's class and our drop-in alike, so that
parity is checked by the suite, not remembered.

pyspark's wheel and its source package ship neither test file (nor any test), so they cannot be
imported here; each test below bears the name of the pyspark test it follows, gives its inputs
and asserts what it asserts. Where pyspark answers cheaply (its constructor, ``input_params``,
its encryption check, its local launch with pyspark's own stub) a test runs on both classes
(``[pyspark]``, ``[ours]``): pyspark's installed class is the reference, so a pyspark that
changes is seen too. Ours always runs as a user runs it (a real job where pyspark's test stubs
its launcher); nothing is mocked but the GPUs (a discovery script that finds three, as pyspark's
tests use). On the tier's ``local[2]`` session instead of pyspark's ``local[4]`` and
``local-cluster[2,2,1024]`` (a cluster's two worker JVMs take most of a minute to start here).

Run, and how each differs from pyspark's:

- ``test_validate_correct_inputs``, ``test_validate_incorrect_inputs``,
  ``test_get_num_tasks_fails``: as written, both classes.
- ``test_encryption_passes``, ``test_encryption_fails``: pyspark's ``_check_encryption()``
  against ours; ours through ``run()`` where it refuses (nothing starts), and where it passes
  through the check every job on Spark tasks makes (a job each would cost seconds; the override's
  real job is in ``test_encryption.py``). The settings are set with ``spark.conf.set`` (pyspark's
  test sets the SparkContext's conf, which a session already in use does not read again).
- ``test_get_num_tasks_distributed``: both classes, with ``num_tasks`` (public in both) for
  ``_get_num_tasks()``; ``spark.task.resource.gpu.amount`` set on the session.
- ``test_get_num_tasks_locally``: both, on ``local[2]`` with the driver's three GPUs; the one
  warning is pyspark's log record and our ``RuntimeWarning``.
- ``test_local_training_succeeds``: pyspark's ``_run_local_training`` with its stub, ours a
  real job on the driver's ranks that returns what rank 0 sees. With ``use_gpu=True`` each sees
  ``num_processes`` of the driver's GPUs: pyspark a random sample ("1", "1,2,0"), ours the
  first ones in local-rank order ("0", "0,1,2"): asserted as such.
- ``DeepspeedTorchDistributorDistributedEndToEnd``'s ``test_simple_function_e2e`` and
  ``test_pytorch_file_e2e`` (``numGpus=True``): ours runs them on Spark tasks (pyspark's would
  start torchrun in each task, 10 s a job here); both classes' ``input_params`` compared.

Left out, and why:

- ``test_execute_command``, ``test_create_torchrun_command``, ``TorchWrapperUnitTests``
  (``test_clean_and_terminate``, ``test_check_parent_alive``) and
  ``DeepspeedTorchDistributorUnitTests`` (``test_get_torchrun_args_local``,
  ``test_get_torchrun_args_distributed``, ``test_create_torchrun_command_local``,
  ``test_create_torchrun_command_distributed``): private helpers of pyspark's torchrun launcher,
  which ours does not have (its ranks start through its own launcher).
- ``test_get_gpus_owned_local``: pyspark's private ``_get_gpus_owned``; ours is
  ``hvd_magics.task.gpus.visible_devices`` (``tests/unit/test_rank_layout.py``).
- ``test_dist_training_succeeds``: a GPU per Spark task needs executors with GPU resources,
  which a local master has not; ``tests/spark_cluster/test_task_layouts.py`` runs our drop-in
  with two (simulated) GPUs per task on the standalone cluster.
- ``test_local_file_with_pytorch``, ``test_distributed_file_with_pytorch``,
  ``test_end_to_end_run_locally``, ``test_end_to_end_run_distributedly``: they download MNIST
  with torchvision (no network, no torchvision here); ``test_engines_local.py`` and
  ``tests/driver/test_engines.py`` train DDP with the drop-in on both sides.
- ``DeepspeedDistributorLocalEndToEndTests`` (the same two on the driver's ranks): 16 s more
  here; ``tests/driver/test_deepspeed.py`` runs a DeepSpeed function and a file with
  ``--deepspeed_config`` on the driver's ranks.
- The Spark Connect copies of these tests (``pyspark/ml/tests/connect/
  test_parity_torch_distributor.py``): the same tests on a Connect session (pyspark skips the
  GPU ones there); ``tests/spark_connect`` checks the encryption refusal on Connect.
"""
import logging
import os
import warnings

import pytest
from pyspark.ml.deepspeed.deepspeed_distributor import (
    DeepspeedTorchDistributor as PysparkDeepspeedTorchDistributor)
from pyspark.ml.torch.distributor import TorchDistributor as PysparkTorchDistributor

from hvd_magics import DeepspeedTorchDistributor, TorchDistributor
from hvd_magics.launch.encryption import IGNORE_SSL, SSL_ENABLED, check_encryption
from tests.conftest import _session

BOTH = pytest.mark.parametrize("distributor", [PysparkTorchDistributor, TorchDistributor],
                               ids=["pyspark", "ours"])
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
TASK_GPU_AMOUNT = "spark.task.resource.gpu.amount"


def _ours(distributor: type) -> bool:
    return distributor.__module__.startswith("hvd_magics")


@pytest.fixture()
def spark(local_spark, monkeypatch):
    """The tier's session; what a test sets on it is unset after."""
    monkeypatch.delenv(CUDA_VISIBLE_DEVICES, raising=False)
    yield local_spark
    for key in (SSL_ENABLED, IGNORE_SSL, TASK_GPU_AMOUNT):
        local_spark.conf.unset(key)


@pytest.fixture(scope="module")
def three_gpus(tmp_path_factory):
    """pyspark's tests' GPU discovery script: three GPUs, 0, 1 and 2 (there are none here)."""
    script = tmp_path_factory.mktemp("gpus") / "three_gpus.sh"
    script.write_text("#!/bin/sh\n"
                      "echo '{\"name\": \"gpu\", \"addresses\": [\"0\", \"1\", \"2\"]}'\n")
    script.chmod(0o755)
    return script


@pytest.fixture()
def driver_gpus(three_gpus, monkeypatch):
    """A local[2] session whose driver holds the three GPUs (pyspark's
    ``TorchDistributorLocalUnitTests`` set-up)."""
    monkeypatch.delenv(CUDA_VISIBLE_DEVICES, raising=False)
    return _session("local[2]", **{"spark.driver.resource.gpu.amount": "3",
                                   "spark.driver.resource.gpu.discoveryScript": str(three_gpus)})


# -- TorchDistributorBaselineUnitTests ---------------------------------------------------------
@BOTH
def test_validate_correct_inputs(spark, distributor):
    for num_processes, local_mode, use_gpu in [(1, True, False), (100, True, False),
                                               (1, False, False), (100, False, False)]:
        made = distributor(num_processes, local_mode, use_gpu)
        assert made.input_params == {"num_processes": num_processes, "local_mode": local_mode,
                                     "use_gpu": use_gpu, "num_tasks": num_processes}


@BOTH
def test_validate_incorrect_inputs(spark, distributor):
    with pytest.raises(ValueError, match="positive"):
        distributor(0, False, False)


def _check_encryption(distributor: type, spark) -> None:
    """pyspark's check, or the one every job of ours on Spark tasks passes."""
    if _ours(distributor):
        check_encryption(spark, distributor._IGNORE_SSL)
    else:
        distributor(1, True, False)._check_encryption()


@BOTH
def test_encryption_passes(spark, distributor):
    for ssl, ignore in [("false", "true"), ("false", "false"), ("true", "true")]:
        spark.conf.set(SSL_ENABLED, ssl)
        spark.conf.set(IGNORE_SSL, ignore)
        _check_encryption(distributor, spark)


@BOTH
def test_encryption_fails(spark, distributor):
    spark.conf.set(SSL_ENABLED, "true")
    spark.conf.set(IGNORE_SSL, "false")
    with pytest.raises(RuntimeError, match="encryption"):
        _check_encryption(distributor, spark)
    if _ours(distributor):  # and a run, as a user starts it: refused before anything starts
        with pytest.raises(RuntimeError, match=f"encryption in transit.*{IGNORE_SSL}"):
            distributor(2, False, False).run(os.getpid)


@BOTH
def test_get_num_tasks_fails(spark, distributor):
    for num_processes in [1, 5, 4]:
        with pytest.raises(RuntimeError, match="driver"):
            distributor(num_processes, True, True)
        with pytest.raises(RuntimeError, match="unset"):
            distributor(num_processes, False, True)


# -- TorchDistributorDistributedUnitTests ------------------------------------------------------
@BOTH
def test_get_num_tasks_distributed(spark, distributor):
    for gpus_per_task, num_processes, num_tasks in [(1, 8, 8), (2, 8, 4), (4, 8, 2)]:
        spark.conf.set(TASK_GPU_AMOUNT, str(gpus_per_task))
        assert distributor(num_processes, False, True).num_tasks == num_tasks
    spark.conf.set(TASK_GPU_AMOUNT, "3")
    with pytest.raises(RuntimeError, match="multiple"):
        distributor(8, False, True)


# -- TorchDistributorLocalUnitTests (the driver holds three GPUs) ------------------------------
def _warnings_of(make, caplog) -> tuple[object, list[str]]:
    """What ``make()`` returned, and the warnings it gave: log records (pyspark's) and Python
    warnings (ours)."""
    caplog.clear()
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        made = make()
    return made, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] + [
        str(w.message) for w in caught]


@BOTH
def test_get_num_tasks_locally(driver_gpus, distributor, caplog):
    for num_processes in [1, 2]:
        made, said = _warnings_of(lambda n=num_processes: distributor(n, True, True), caplog)
        assert made.num_tasks == num_processes and said == []
    for num_processes in [4, 8]:
        made, said = _warnings_of(lambda n=num_processes: distributor(n, True, True), caplog)
        assert len(said) == 1 and "3" in said[0]
        assert made.num_processes == 3 and made.input_params["num_processes"] == 3


def _seen(*_: object) -> str:
    return os.environ.get(CUDA_VISIBLE_DEVICES, "NONE")


@BOTH
def test_local_training_succeeds(driver_gpus, distributor, monkeypatch):
    for visible, num_processes, use_gpu, expected in [("0,1,2", 1, True, None),
                                                      ("0,1,2", 3, True, None),
                                                      ("0,1,2", 2, False, "0,1,2"),
                                                      (None, 3, False, "NONE")]:
        if visible is None:
            monkeypatch.delenv(CUDA_VISIBLE_DEVICES, raising=False)
        else:
            monkeypatch.setenv(CUDA_VISIBLE_DEVICES, visible)
        made = distributor(num_processes, True, use_gpu)
        seen = (made.run(_seen) if _ours(distributor) else
                made._run_local_training(_seen, "train.py", None))
        if expected is not None:
            assert seen == expected
        else:  # num_processes of the driver's GPUs
            devices = seen.split(",")
            assert len(set(devices)) == num_processes and set(devices) <= {"0", "1", "2"}
        assert os.environ.get(CUDA_VISIBLE_DEVICES) == visible  # the driver's own, unchanged


def _pythagoras(leg1: float, leg2: float) -> float:
    import deepspeed  # noqa: F401 - as pyspark's test function

    return (leg1 * leg1 + leg2 * leg2) ** 0.5


PYTHAGORAS_FILE = """
import sys
def pythagorean_thm(x : int, y: int):
    import deepspeed
    return (x*x + y*y)**0.5
print(pythagorean_thm(int(sys.argv[1]), int(sys.argv[2])))
"""


def _deepspeed(**arguments) -> DeepspeedTorchDistributor:
    """Ours, once its ``input_params`` are seen to be pyspark's for the same arguments."""
    ours = DeepspeedTorchDistributor(**arguments)
    assert ours.input_params == PysparkDeepspeedTorchDistributor(**arguments).input_params
    return ours


# -- DeepspeedTorchDistributorDistributedEndToEnd ---------------------------------------------
def test_simple_function_e2e(spark):
    distributor = _deepspeed(numGpus=2, useGpu=False, localMode=False)
    assert distributor.run(_pythagoras, 3, 4) == 5


def test_pytorch_file_e2e(spark, tmp_path, capfd):
    path = tmp_path / "test_deepspeed_training_file.py"
    path.write_text(PYTHAGORAS_FILE)
    distributor = _deepspeed(numGpus=True, useGpu=False, localMode=False)  # one process
    assert distributor.run(str(path), 2, 5) is None
    assert "5.385164807134504" in capfd.readouterr().out
