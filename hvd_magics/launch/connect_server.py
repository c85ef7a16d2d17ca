"""A Spark Connect session's server as a job sees it: asked whether it is gone once the job has
reason to (it then stays gone, and the session's calls stop retrying it), and a stage cancelled
by its tag without waiting long on it."""
from __future__ import annotations

import threading
from typing import Any

from hvd_magics.launch.spark_session import connect_server_gone, give_up_retries

#: How long the cancel of a Connect job may take (pyspark retries for ten minutes otherwise).
INTERRUPT_WAIT_S = 10.0


class ConnectServer:
    """The server of the Connect session ``spark``.

    Parameters
    ----------
    spark : SparkSession
        A Spark Connect session.
    """

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        #: Why the server counts as gone (``None``: it answers, or not checked).
        self.gone: str | None = None

    def is_gone(self) -> bool:
        """Whether the server is gone (asked until it is: it stays gone); its calls then stop
        retrying."""
        if self.gone is None:
            self.gone = connect_server_gone(self.spark)
            if self.gone:
                give_up_retries(self.spark)
        return self.gone is not None

    def interrupt(self, tag: str) -> None:
        """Cancel the operations of ``tag``, waiting at most :data:`INTERRUPT_WAIT_S` (not at
        all when the server is gone: pyspark would retry it for ten minutes)."""
        if self.is_gone():
            return

        def interrupt() -> None:
            try:
                self.spark.interruptTag(tag)
            except Exception:  # noqa: BLE001,S110 - the server went away meanwhile
                pass

        thread = threading.Thread(target=interrupt, name="hvd-interrupt-tag", daemon=True)
        thread.start()
        thread.join(INTERRUPT_WAIT_S)
