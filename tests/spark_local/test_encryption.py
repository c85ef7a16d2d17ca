"""A session that asks for TLS (``spark.ssl.enabled=true``): every job on Spark tasks is refused
before anything starts, as pyspark's ``TorchDistributor`` refuses it (the ranks' Horovod, Gloo
and NCCL traffic is not encrypted), unless pyspark's setting allows it; ranks on the driver meet
on 127.0.0.1 and are not checked. The settings are set on the tier's session, as a user would
(``spark.conf.set``), and unset after."""
import pytest

from hvd_magics import (DeepspeedTorchDistributor, HorovodPool, HorovodRunner, TorchDistributor,
                        distributed, last_run)
from hvd_magics.errors import EncryptionRequired
from hvd_magics.launch.encryption import DEEPSPEED_IGNORE_SSL, IGNORE_SSL, SSL_ENABLED
from tests import jobs


def refused(setting: str) -> str:
    return (f"{SSL_ENABLED}=true asks for data encryption in transit, which the ranks' training "
            "traffic (Horovod's, Gloo's, NCCL's) does not have. Fix: to train unencrypted "
            f'anyway, spark.conf.set("{setting}", "true") (or --conf {setting}=true when Spark '
            "starts).")


@pytest.fixture()
def tls_spark(local_spark):
    local_spark.conf.set(SSL_ENABLED, "true")
    yield local_spark
    for key in (SSL_ENABLED, IGNORE_SSL, DEEPSPEED_IGNORE_SSL):
        local_spark.conf.unset(key)


def _rank():
    import os

    return int(os.environ["RANK"])


def test_every_kind_of_job_on_spark_tasks_is_refused_before_it_starts(tls_spark, ip):
    starts = [
        lambda: HorovodRunner(np=2).run(jobs.print_lines, count=1),
        lambda: HorovodRunner(np=2).start(jobs.print_lines, count=1),
        lambda: HorovodRunner(np="1:2").run(jobs.print_lines, count=1),
        lambda: ip.run_cell_magic("horovod", "np=2 -q", "print('ran')"),
        lambda: HorovodPool(np=2),
        lambda: TorchDistributor(2, local_mode=False, use_gpu=False).run(_rank),
        lambda: distributed(gpus=2, remote=True)(_rank).distributed(),
    ]
    for start in starts:
        with pytest.raises(EncryptionRequired) as caught:
            start()
        assert str(caught.value) == refused(IGNORE_SSL)
        assert isinstance(caught.value, RuntimeError)  # as pyspark's error is
        assert last_run() is None  # no job began
    # DeepSpeed's drop-in reads pyspark's DeepSpeed setting, not TorchDistributor's
    tls_spark.conf.set(IGNORE_SSL, "true")
    with pytest.raises(EncryptionRequired, match=DEEPSPEED_IGNORE_SSL) as caught:
        DeepspeedTorchDistributor(numGpus=2, localMode=False, useGpu=False).run(_rank)
    assert str(caught.value) == refused(DEEPSPEED_IGNORE_SSL)


def test_pysparks_setting_lets_the_job_run_and_the_cell_says_so(tls_spark, capsys):
    tls_spark.conf.set(IGNORE_SSL, "True")  # read as pyspark reads it: any case
    assert TorchDistributor(2, local_mode=False, use_gpu=False).run(_rank) == 0
    assert (f"hvd_magics: {SSL_ENABLED}=true and {IGNORE_SSL}=true: this job's training traffic "
            "between the ranks goes unencrypted.") in capsys.readouterr().err
    tls_spark.conf.set(IGNORE_SSL, "yes")  # neither true nor false: it allows nothing
    with pytest.raises(EncryptionRequired):
        HorovodRunner(np=2).run(jobs.print_lines, count=1)


def test_ranks_on_the_driver_are_not_checked(tls_spark, capsys):
    assert HorovodRunner(np=-2).run(jobs.print_lines, count=1) == 0
    assert TorchDistributor(2, local_mode=True, use_gpu=False).run(_rank) == 0
    assert "unencrypted" not in capsys.readouterr().err
