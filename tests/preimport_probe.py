"""Imported by a rank: remembers the rendezvous port its environment had at that moment (``0``
while the rank waits for its job, the real port once the job arrived)."""
import os

PORT_AT_IMPORT = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
