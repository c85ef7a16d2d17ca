"""Virtual environments for the tests of issue 39: a small one of its own for ship_environment()
(made with venv, no pip, so it packs in a second, holding one package only it has), and one
whose Python has the frameworks but not hvd_magics (executors that lack our package)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def small_environment(folder: Path, marker_version: str) -> Path:
    """A virtual environment of its own (no pip: small to pack) holding one package, installed
    as pip installs one (its files and a dist-info with its version and RECORD)."""
    if not (folder / "pyvenv.cfg").exists():
        subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(folder)],
                       check=True)
    site = next(folder.glob("lib/python*/site-packages"))
    for old in site.glob("shipped_marker*"):
        shutil.rmtree(old)
    (site / "shipped_marker").mkdir()
    (site / "shipped_marker" / "__init__.py").write_text(f"VERSION = {marker_version!r}\n")
    info = site / f"shipped_marker-{marker_version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: shipped_marker\n"
                                   f"Version: {marker_version}\n")
    (info / "RECORD").write_text("shipped_marker/__init__.py,,\n")
    return folder


def frameworks_only_python(folder: Path) -> str:
    """A venv whose site-packages reach this one's frameworks through a ``.pth`` line, which does
    not run the editable install's own ``.pth``: ``import hvd_magics`` fails there."""
    import sysconfig

    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], check=True, capture_output=True, text=True)
    Path(site.stdout.strip(), "frameworks.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = subprocess.run([str(python), "-c", "import torch, horovod, pyspark\nimport hvd_magics"],
                           cwd=folder, capture_output=True, text=True)
    assert "No module named 'hvd_magics'" in probe.stderr, probe.stderr  # what the tests need
    return str(python)


def arrow_only_python(folder: Path) -> str:
    """An interpreter with pyarrow and numpy but none of hvd_magics' packages (no frameworks, no
    Horovod): an executor that has what Spark's Arrow tasks need and nothing more (Spark puts
    pyspark on its workers' path)."""
    import os

    import numpy
    import pyarrow

    lib = folder / "lib"
    lib.mkdir(parents=True)
    for module in (pyarrow, numpy):
        root = os.path.dirname(module.__file__)
        (lib / os.path.basename(root)).symlink_to(root)
        libs = root + ".libs"
        if os.path.isdir(libs):
            (lib / os.path.basename(libs)).symlink_to(libs)
    script = folder / "python3"
    script.write_text(f'#!/bin/sh\nPYTHONPATH="{lib}:$PYTHONPATH" exec {sys._base_executable} -S "$@"\n')
    script.chmod(0o755)
    return str(script)


def reach_frameworks(env: Path) -> Path:
    """Let the virtual environment ``env`` import this one's frameworks (its ``sitecustomize``
    appends this one's site-packages; a ``.pth`` line would be refused as an editable install,
    and the editable install of hvd_magics does not run there, so hvd_magics only comes with the
    job): a notebook's environment, small to pack."""
    import sysconfig

    site = next(env.glob("lib/python*/site-packages"))
    (site / "sitecustomize.py").write_text(
        f"import sys\nsys.path.append({sysconfig.get_paths()['purelib']!r})\n")
    return env
