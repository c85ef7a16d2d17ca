"""IPython magics (placeholder until the magic issue lands)."""
from IPython.core.magic import Magics, cell_magic, magics_class


@magics_class
class HorovodMagics(Magics):
    @cell_magic
    def horovod(self, line: str, cell: str):
        raise NotImplementedError
