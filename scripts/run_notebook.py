"""Execute a notebook headless in a real Jupyter kernel and save it with its widget state.

Usage: python scripts/run_notebook.py NOTEBOOK [OUTPUT]
The executed copy goes to example_notebooks/executed/ unless OUTPUT is given. It runs with the
values its ``parameters`` cell holds; the tests give smaller ones (``execute(parameters=...)``).
"""
from __future__ import annotations

import ast
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: reading it takes a second (its JSON schemas)
    import nbformat

#: papermill's tags: the notebook's own values, and the cell a run with parameters adds after it
PARAMETERS_TAG = "parameters"
INJECTED_TAG = "injected-parameters"


def execute(path: Path, output: Path, timeout: int = 600, cwd: Path | None = None,
            kernel: str = "python3", allow_errors: bool = False,
            parameters: dict[str, Any] | None = None) -> nbformat.NotebookNode:
    """Run every cell of ``path`` in a fresh kernel (``python3``, or the kernel spec named
    ``kernel``), in the folder ``cwd`` (the notebook's own by default; the tests give one of
    theirs, so that what a notebook writes in its working folder stays out of the repository);
    write the result to ``output``. The first failing cell raises, unless ``allow_errors``.
    ``parameters`` override the values of the notebook's parameters cell (see
    :func:`inject_parameters`).

    The kernel process's own stdout and stderr (TensorFlow's start-up lines when a cell imports
    it, Jupyter's warnings) go to ``<output>.kernel.log``: the notebook holds what cells show.
    """
    import nbformat

    nb = nbformat.read(path, as_version=4)
    if parameters:
        inject_parameters(nb, parameters)
    from nbclient import NotebookClient  # here: reading a notebook's cells needs no kernel

    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel,
                            resources={"metadata": {"path": str(cwd or path.parent)}},
                            store_widget_state=True, allow_errors=allow_errors)
    output.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(kernel_log(output), "wb") as log:
            client.execute(stdout=log, stderr=log)
    finally:
        nbformat.write(nb, output)
    return nb


def inject_parameters(nb: nbformat.NotebookNode, parameters: dict[str, Any]) -> None:
    """Insert, right after the cell tagged ``parameters``, a cell tagged ``injected-parameters``
    that assigns ``parameters`` (as papermill does): the rest of the notebook reads those values.

    Raises
    ------
    ValueError
        If no cell (or more than one) is tagged ``parameters``, or a name given is not one that
        cell assigns (a misspelt name would leave the notebook running its full size).
    """
    tagged = [i for i, cell in enumerate(nb.cells)
              if PARAMETERS_TAG in cell.get("metadata", {}).get("tags", [])]
    if len(tagged) != 1:
        raise ValueError(f"{len(tagged)} cells are tagged {PARAMETERS_TAG!r}; a notebook run "
                         f"with parameters needs exactly one")
    unknown = sorted(set(parameters) - parameter_names(nb.cells[tagged[0]].source))
    if unknown:
        raise ValueError(f"not assigned in the parameters cell: {', '.join(unknown)}")
    source = "# Parameters\n" + "".join(f"{name} = {value!r}\n"
                                        for name, value in parameters.items())
    import nbformat

    cell = nbformat.v4.new_code_cell(source, metadata={"tags": [INJECTED_TAG]})
    nb.cells.insert(tagged[0] + 1, cell)


def parameter_names(source: str) -> set[str]:
    """The names a parameters cell's ``source`` assigns at its top level."""
    names = set()
    for node in ast.parse(source).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def kernel_log(output: Path) -> Path:
    """Where the kernel that executed ``output`` wrote its own output."""
    return output.with_suffix(".kernel.log")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(argv[1]).resolve()
    output = Path(argv[2]).resolve() if len(argv) > 2 else path.parent / "executed" / path.name
    from nbclient.exceptions import CellExecutionError

    start = time.monotonic()
    try:
        execute(path, output)
    except CellExecutionError as exc:
        print(f"{path.name} failed; the executed notebook (with the error) is {output}\n{exc}",
              file=sys.stderr)
        return 1
    print(f"{path.name} ran in {time.monotonic() - start:.0f} s; executed notebook: {output} "
          f"(the kernel's own log: {kernel_log(output)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
