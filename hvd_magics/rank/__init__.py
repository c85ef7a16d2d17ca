"""Runs inside a rank process: the entry point, the cell runner, progress reporting, and the pipe to
the supervisor. Imports nothing from the notebook, job, launch or task side (a test checks it)."""
