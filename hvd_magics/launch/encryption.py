"""Spark's TLS setting against the ranks' training traffic, which no engine encrypts (Horovod's
and Gloo's TCP, NCCL's sockets): a job on Spark tasks of a session with ``spark.ssl.enabled=true``
is refused unless the session allows it, as pyspark's ``TorchDistributor`` refuses it, with
pyspark's own settings and their values read as pyspark reads them (``spark.conf.get``, through
the session, a Spark Connect one too).

Ranks on the driver (``np < 0``) are not checked: they meet on 127.0.0.1, so their traffic never
leaves the machine, and pyspark's ``local_mode=True`` runs without the check too.
"""
from __future__ import annotations

from typing import Any

from hvd_magics.errors import EncryptionRequired
from hvd_magics.notices import say

#: Spark's setting that asks for encryption in transit.
SSL_ENABLED = "spark.ssl.enabled"
#: pyspark's ``TorchDistributor`` setting that allows unencrypted training anyway; every job of
#: ours honours it (``%%horovod``, ``HorovodRunner``, pools, the drop-ins).
IGNORE_SSL = "pytorch.spark.distributor.ignoreSsl"
#: pyspark's ``DeepspeedTorchDistributor`` setting, which its drop-in honours instead.
DEEPSPEED_IGNORE_SSL = "deepspeed.spark.distributor.ignoreSsl"


def _is_true(spark: Any, key: str) -> bool:
    """Whether ``key`` is ``true`` in the session (pyspark's ``_get_conf_boolean``: unset is
    ``false``; a value that is neither counts as ``false`` here, so it never allows anything)."""
    value = spark.conf.get(key, "false")
    return str(value).strip().lower() == "true"


def check_encryption(spark: Any, override: str = IGNORE_SSL) -> None:
    """Refuse a job on ``spark``'s tasks when the session asks for TLS, unless ``override`` is
    ``true`` there (then say in one line that the job's traffic goes unencrypted).

    Raises
    ------
    EncryptionRequired
        When ``spark.ssl.enabled`` is ``true`` and ``override`` is not; the message names the
        setting and how to set it.
    """
    if not _is_true(spark, SSL_ENABLED):
        return
    if _is_true(spark, override):
        say(f"{SSL_ENABLED}=true and {override}=true: this job's training traffic between the "
            "ranks goes unencrypted.")
        return
    raise EncryptionRequired(
        f"{SSL_ENABLED}=true asks for data encryption in transit, which the ranks' training "
        "traffic (Horovod's, Gloo's, NCCL's) does not have. Fix: to train unencrypted anyway, "
        f'spark.conf.set("{override}", "true") (or --conf {override}=true when Spark starts).')
