"""Execute a notebook headless in a real Jupyter kernel and save it with its widget state.

Usage: python scripts/run_notebook.py NOTEBOOK [OUTPUT]
The executed copy goes to example_notebooks/executed/ unless OUTPUT is given.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def execute(path: Path, output: Path, timeout: int = 600, cwd: Path | None = None,
            kernel: str = "python3", allow_errors: bool = False) -> nbformat.NotebookNode:
    """Run every cell of ``path`` in a fresh kernel (``python3``, or the kernel spec named
    ``kernel``), in the folder ``cwd`` (the notebook's own by default; the tests give one of
    theirs, so that what a notebook writes in its working folder stays out of the repository);
    write the result to ``output``. The first failing cell raises, unless ``allow_errors``.

    The kernel process's own stdout and stderr (TensorFlow's start-up lines when a cell imports
    it, Jupyter's warnings) go to ``<output>.kernel.log``: the notebook holds what cells show.
    """
    nb = nbformat.read(path, as_version=4)
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


def kernel_log(output: Path) -> Path:
    """Where the kernel that executed ``output`` wrote its own output."""
    return output.with_suffix(".kernel.log")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    path = Path(argv[1]).resolve()
    output = Path(argv[2]).resolve() if len(argv) > 2 else path.parent / "executed" / path.name
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
