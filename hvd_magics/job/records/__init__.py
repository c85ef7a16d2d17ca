"""What stays after a job: its record, epoch timing, Horovod Timeline files, run logs and its
MLflow run."""
