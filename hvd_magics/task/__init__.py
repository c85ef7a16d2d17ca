"""Runs in a Spark barrier task (or, for ``np < 0``, in the driver for each rank): plan the slot,
start the rank process, supervise it and forward its events. Imports nothing from the notebook or
job side."""
