"""A small virtual environment for the tests of ship_environment(): its own, made with venv (no
pip, so it packs in a second), holding one package only it has."""
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
