"""Runs on the driver while a job runs: the runner, what the driver knows of the job, how it shows
it, and what stays after it."""
