"""What the driver judges of a running job, each in its own module: the monitors the watch asks
every turn (:class:`hvd_magics.job.verdicts.monitor.Monitor`) and the straggler verdict drawn from
the steps' splits as they arrive; what they judge is in :mod:`hvd_magics.job.readings`."""
