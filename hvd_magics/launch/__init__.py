"""Runs on the driver to start ranks: the backends (a Spark barrier stage, processes on the driver),
rank planning, GPU assignment."""
