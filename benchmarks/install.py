"""What a user's install costs: our wheel into a fresh venv, and Horovod built for it.

1. ``pip wheel --no-deps .``, then a fresh venv and ``pip install torch==2.13.0 pyspark==4.3.0
   ipykernel <wheel>[horovod]`` (the frameworks from pip's cache, as on a machine that had them
   before): seconds, and what it pulled (packages, MB on disk).
2. ``python -m hvd_magics.horovod build`` in that venv with an empty cache: the build (PyTorch
   alone; ``--no-cold-build`` leaves it out, about 7 minutes on 2 cores).
3. A second fresh venv of the same frameworks, the same command with that cache: the install.
Usage: .venv/bin/python benchmarks/install.py [--no-cold-build] [--cache DIR]
Last line: install pip_s=<s> packages=<n> venv_mb=<MB> build_cold_s=<s> build_cached_s=<s>
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ["torch==2.13.0", "pyspark==4.3.0", "ipykernel"]


def fresh_venv(folder: Path, wheel: Path) -> tuple[Path, float]:
    """A venv in ``folder`` with the frameworks and the wheel; its Python and the seconds pip
    took."""
    subprocess.run([sys._base_executable, "-m", "venv", str(folder)], check=True)
    python = folder / "bin" / "python"
    began = time.perf_counter()
    subprocess.run([str(python), "-m", "pip", "install", "-q", *FRAMEWORKS, f"{wheel}[horovod]"],
                   check=True, stderr=subprocess.DEVNULL)
    return python, time.perf_counter() - began


def build(python: Path, cache: Path) -> float:
    """Seconds of ``python -m hvd_magics.horovod build`` with the cache ``cache``."""
    began = time.perf_counter()
    subprocess.run([str(python), "-m", "hvd_magics.horovod", "build"], check=True,
                   env={**os.environ, "HVD_MAGICS_CACHE": str(cache)}, cwd=cache.parent)
    return time.perf_counter() - began


def size_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-cold-build", action="store_true",
                        help="reuse --cache instead of building Horovod with an empty cache")
    parser.add_argument("--cache", type=Path, default=None,
                        help="the build cache (default: a new empty folder)")
    args = parser.parse_args()
    if args.no_cold_build and args.cache is None:
        parser.error("--no-cold-build needs --cache: the folder of an earlier build")
    work = Path(tempfile.mkdtemp(prefix="hvd-install-"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w",
                    str(work / "dist"), str(ROOT)], check=True, stderr=subprocess.DEVNULL)
    wheel = next((work / "dist").glob("hvd_magics-*.whl"))
    python, pip_s = fresh_venv(work / "first", wheel)
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"],
                            capture_output=True, text=True, check=True).stdout.split()
    print(f"pip install into a fresh venv: {pip_s:.1f} s, {len(listed)} packages, "
          f"{size_mb(work / 'first'):.0f} MB", flush=True)
    cache = args.cache or work / "cache"
    cold = float("nan")
    if not args.no_cold_build:
        cold = build(python, cache)
        print(f"Horovod built with an empty cache: {cold:.0f} s", flush=True)
    second, _ = fresh_venv(work / "second", wheel)
    cached = build(second, cache)
    print(f"Horovod into a second fresh venv from the cache: {cached:.1f} s", flush=True)
    print(f"install pip_s={pip_s:.1f} packages={len(listed)} venv_mb={size_mb(work / 'first'):.0f} "
          f"build_cold_s={cold:.0f} build_cached_s={cached:.1f}")


if __name__ == "__main__":
    main()
