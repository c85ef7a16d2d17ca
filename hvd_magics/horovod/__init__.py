"""Horovod for the user's own environment: ``python -m hvd_magics.horovod build`` builds our
patched Horovod 0.28.1 against the TensorFlow and PyTorch installed here (:mod:`.build`, with
the changes in :mod:`.patches`), and ``python -m hvd_magics.horovod check`` says what the
installed one was built for.

This folder runs from a shell (or a notebook's ``!`` line) before any job: it imports nothing
of the notebook, job, launch, task or rank floors.
"""
