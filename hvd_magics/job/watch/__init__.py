"""Following a job from the driver: its events applied, its monitors asked each turn, its end
judged (the verdicts themselves are in :mod:`hvd_magics.job.verdicts`)."""
