"""Run a captured notebook cell on a rank.

The cell runs as top-level code in a fresh namespace (on a warm pool: in the rank's kept
namespace, :func:`rank_namespace`), with the notebook values it read and its modules imported
again by name. Line numbers in tracebacks are the cell's own (the ``%%horovod``
line is line 1), and the cell's source is shown in them.
"""
from __future__ import annotations

import ast
import builtins
import importlib
import itertools
import linecache
from dataclasses import dataclass, field
from typing import Any

from hvd_magics.common.kept_values import unpack_values
from hvd_magics.result_codec import RETURN_PREFIX, VALUE, Parts

#: Traceback file name of a captured cell.
CELL_FILENAME = "<%%horovod cell>"


@dataclass
class CapturedCell:
    """A cell ready to ship: its source, the notebook values it reads, and what to bring back."""

    source: str
    header: str = "%%horovod"
    values: dict[str, Any] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)
    return_names: tuple[str, ...] = ()


#: The namespace that lives as long as the rank process (see :func:`rank_namespace`).
_KEPT: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
#: Numbers the kept cells of this process (each gets a traceback file name of its own).
_CELL_NUMBERS = itertools.count(1)


def rank_namespace() -> dict[str, Any]:
    """The namespace that lives as long as this rank process.

    On a warm pool (``%hvd_pool``, :class:`hvd_magics.HorovodPool`) every ``%%horovod`` cell runs
    in it, so what one cell defines the next one finds; a function run on a pool may keep objects
    in it between runs (``rank_namespace()["model"] = model``). On a cold job the process, and so
    the namespace, is new each time.
    """
    return _KEPT


def run_captured_cell(cell: CapturedCell, kept: bool = False) -> Parts:
    """Run on a rank: execute the cell (in :func:`rank_namespace` when ``kept``); return its last
    expression's value and the asked names, each a part of its own (so that each is decoded on
    its own in the notebook)."""
    filename = f"<%%horovod cell {next(_CELL_NUMBERS)}>" if kept else CELL_FILENAME
    lines = [cell.header + "\n"] + cell.source.splitlines(True)
    linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    namespace: dict[str, Any] = (_KEPT if kept else
                                 {"__name__": "__main__", "__builtins__": builtins})
    for alias, module in cell.modules.items():
        namespace[alias] = importlib.import_module(module)
    namespace.update(unpack_values(cell.values))
    tree = ast.parse(cell.source, filename)
    ast.increment_lineno(tree, 1)  # the %%horovod line is line 1 of the cell
    last = None
    final = tree.body[-1] if tree.body else None
    if isinstance(final, ast.Expr):
        tree.body.pop()
        last = ast.Expression(final.value)
    exec(compile(tree, filename, "exec"), namespace)  # noqa: S102 - running the user's cell
    value = eval(compile(last, filename, "eval"), namespace) if last else None  # noqa: S307
    missing = [n for n in cell.return_names if n not in namespace]
    if missing:
        raise NameError(f"--return names {', '.join(missing)}, which the cell did not define")
    return Parts({VALUE: value, **{RETURN_PREFIX + n: namespace[n] for n in cell.return_names}})
