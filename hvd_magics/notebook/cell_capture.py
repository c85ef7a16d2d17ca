"""Turn a notebook cell into a job: the code and the notebook values it uses.

Names the cell reads that the notebook defines are shipped (functions and classes from earlier
cells by value, data as pickles); modules are imported again by name on the rank. The rank side
(:mod:`hvd_magics.rank.cell_runner`) runs what this module captured.
"""
from __future__ import annotations

import ast
import builtins
import re
import types
from dataclasses import dataclass
from typing import Any
from collections.abc import Mapping

from hvd_magics.errors import CellError
from hvd_magics.launch.payload import leading_imports
from hvd_magics.rank.cell_runner import CapturedCell

#: Names IPython puts in the user namespace that a cell never wants shipped.
_IPYTHON_NAMES = frozenset({"In", "Out", "get_ipython", "exit", "quit", "_", "__", "___", "_i",
                            "_ii", "_iii", "_ih", "_oh", "_dh", "__builtins__", "__name__"})


def check_plain_python(source: str) -> None:
    """Raise :class:`CellError` when the cell uses IPython-only syntax (``%magic``, ``!cmd``)."""
    from IPython.core.inputtransformer2 import TransformerManager

    lines = source.splitlines()
    blank = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    body = "\n".join(lines[blank:])  # IPython drops leading blank lines; Python does not mind
    transformed = TransformerManager().transform_cell(body)
    if transformed.rstrip() == body.rstrip():
        return
    for number, (before, after) in enumerate(zip(lines[blank:], transformed.splitlines()),
                                             2 + blank):
        if before != after:
            raise CellError(
                f"line {number} uses IPython syntax ({before.strip()[:40]!r}): a %%horovod cell "
                "runs as plain Python on the ranks. Use Python instead (subprocess.run for !cmd), "
                "or move the line to another cell.")
    raise CellError("the cell uses IPython syntax: a %%horovod cell runs as plain Python on the "
                    "ranks. Use Python instead, or move that line to another cell.")


def parse_cell(source: str) -> ast.Module:
    """The cell's syntax tree; :class:`CellError` (with the cell's line number) when it has none."""
    try:
        return ast.parse(source)
    except SyntaxError as exc:
        raise CellError(f"line {(exc.lineno or 0) + 1}: {exc.msg}") from None


def free_names(source: str | ast.Module) -> list[str]:
    """Names the cell reads before (or without) binding them itself, in first-use order."""
    tree = parse_cell(source) if isinstance(source, str) else source
    first_load: dict[str, int] = {}
    first_bind: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            table = first_load if isinstance(node.ctx, ast.Load) else first_bind
            table[node.id] = min(table.get(node.id, node.lineno), node.lineno)
    for node in tree.body:  # top-level imports, defs and classes bind names too
        bound: list[str] = []
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound = [(a.asname or a.name).split(".")[0] for a in node.names]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound = [node.name]
        for name in bound:
            first_bind[name] = min(first_bind.get(name, node.lineno), node.lineno)
    names = [n for n in first_load if not (n in first_bind and first_bind[n] < first_load[n])]
    return sorted(names, key=first_load.__getitem__)


def top_level_bindings(source: str | ast.Module) -> set[str] | None:
    """Names the cell binds in its own (top-level) scope; ``None`` when it cannot be told
    (``from x import *``)."""
    bound: set[str] = set()

    def visit(node: ast.AST, top: bool) -> bool:
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return False
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if top:
                bound.add(node.name)
            top = False  # a body binds its own names, except those it declares global
        elif isinstance(node, ast.Global):
            bound.update(node.names)
        elif isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
                               ast.GeneratorExp)):
            top = False
        elif top and isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif top and isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif top and isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif top and isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
        return all(visit(child, top) for child in ast.iter_child_nodes(node))

    tree = parse_cell(source) if isinstance(source, str) else source
    return bound if visit(tree, True) else None


def unbound_return_names(source: str | ast.Module, names: tuple[str, ...]) -> list[str]:
    """The ``--return`` names that the cell never binds at its top level."""
    bound = top_level_bindings(source)
    return [] if bound is None else [n for n in names if n not in bound]


@dataclass
class CellPlan:
    """A cell made into a job, from one parse of it: what travels, and what the driver checks."""

    #: What the ranks run: the code and the notebook values and modules it reads.
    cell: CapturedCell
    #: The ``--return`` names the cell never binds at its top level (rank 0 could not send them).
    unbound_returns: list[str]
    #: The modules the cell imports before anything else (ranks import them early).
    preimport: tuple[str, ...]


def capture(source: str, user_ns: Mapping[str, Any], header: str = "%%horovod",
            return_names: tuple[str, ...] = ()) -> CellPlan:
    """Collect what the cell needs from the notebook namespace, parsing it once.

    Raises
    ------
    CellError
        For IPython syntax or a syntax error in the cell.
    """
    check_plain_python(source)
    tree = parse_cell(source)
    cell = CapturedCell(source=source, header=header, return_names=return_names)
    for name in free_names(tree):
        if name in _IPYTHON_NAMES or name not in user_ns or hasattr(builtins, name):
            continue
        value = user_ns[name]
        if isinstance(value, types.ModuleType):
            cell.modules[name] = value.__name__
        else:
            cell.values[name] = value
    return CellPlan(cell, unbound_return_names(tree, return_names),
                    tuple(leading_imports(tree)))


#: Horovod's Keras API, which trains Keras 2 models only.
_HOROVOD_KERAS = re.compile(r"\bhorovod\.(tensorflow\.)?keras\b")


def keras_3_values(plan: CellPlan) -> list[str]:
    """The notebook variables the cell reads that are Keras 3 models (the ``keras`` package),
    when the cell uses Horovod's Keras API, which cannot train them."""
    if not _HOROVOD_KERAS.search(plan.cell.source):
        return []
    return [name for name, value in plan.cell.values.items()
            if type(value).__module__.startswith("keras.") and hasattr(value, "fit")]
