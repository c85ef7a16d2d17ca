"""The training libraries a rank meets, one module each: what hvd_magics adds to each with no
line added to the user's code (progress on the dashboard, saving on a preemption notice, the
job's shape), and what it refuses with the fix (a library that would start its own processes,
or train its rank alone).

- :mod:`.keras`: Keras's ``fit`` (progress; a tf worker that would train alone);
- :mod:`.hugging_face`: the ``Trainer`` (progress, saving on a notice, resuming; alone);
- :mod:`.lightning`: the ``Trainer`` and ``Fabric`` (progress, saving on a notice, resuming, the
  job's shape; launching its own processes; alone);
- :mod:`.accelerate`: its launchers (refused) and its state (joined to the job on CPU);
- :mod:`.plain_loops`: hand-written DDP and Accelerate loops (progress);
- :mod:`.trackers`: MLflow runs a library or the cell creates itself;
- :mod:`.deepspeed`: a DeepSpeed script run as pyspark's ``DeepspeedTorchDistributor`` runs it;
- :mod:`.torch_extensions`: PyTorch's C++ extensions built on first use (DeepSpeed's ops): a
  build killed half-way no longer blocks every later one.

What ``checkpoint.save`` does with sharded state and DeepSpeed engines is the checkpoint's own
(:mod:`hvd_magics.rank.api.torch_dcp`, :mod:`hvd_magics.rank.api.deepspeed_checkpoint`): this
room uses the api (progress, the preemption notice), never the other way round.

:mod:`.guards` holds what the guards share. Each module's ``install()`` hooks its library
whenever it is imported (:mod:`hvd_magics.rank.guards.import_hooks`); nothing is imported here.
"""
from __future__ import annotations


def install() -> None:
    """Hook every library (in a rank, before the job's code runs)."""
    from hvd_magics.rank.integrations import (accelerate, hugging_face, keras, lightning,
                                              plain_loops, torch_extensions, trackers)

    for library in (keras, lightning, hugging_face, plain_loops, trackers, accelerate,
                    torch_extensions):
        library.install()
