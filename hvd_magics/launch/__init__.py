"""Runs on the driver to start ranks and bring them their data: the backends (a Spark barrier
stage, an elastic stage, processes on the driver), the Spark session and slot checks, the job's
payload, DataFrames as one sharded input (and a warm pool's deal, kept while its data is provably
the same), the tasks' meeting point, interrupt and console-bar guards. Imports nothing from the
notebook, estimator or job side."""
