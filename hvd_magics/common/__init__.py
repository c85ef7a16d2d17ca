"""What the driver and the ranks both use, on a floor below both: checkpoints that stay whole,
the values a warm pool keeps, the estimator's fit spec, process groups, a rank's temporary
folder, where a host's zygotes serve."""
