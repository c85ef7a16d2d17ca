"""What a job's code calls on a rank: ``checkpoint`` (and ``checkpoint.preempting()``),
``progress``, ``log_to_driver``, a DataFrame's ``Shard``."""
