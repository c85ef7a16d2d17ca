"""What the driver judges of a running job, each in its own module: the monitors the watch asks
every turn (:class:`hvd_magics.job.watch.monitor.Monitor`) and the readings they rest on."""
