"""Runs in the notebook's kernel: the ``%%horovod`` front end, cell capture, the GPU guard, and
what a job ships."""
