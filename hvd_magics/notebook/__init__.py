"""Runs in the notebook's kernel only: the IPython magics (``%%horovod``, ``%hvd_pool``,
``%hvd_stacks``, ``%hvd_timeline``, ``%hvd_mlflow``), turning a cell into a job (its code and the
notebook values it reads) and the driver's GPU guard. What a job ships is built one floor down
(:mod:`hvd_magics.launch.payload`), where ``HorovodRunner`` uses it too."""
