"""Build our patched Horovod 0.28.1 for the Python environment this runs in, once, and install it.

PyPI's Horovod 0.28.1 does not build against today's TensorFlow and PyTorch, and it lacks fixes
hvd_magics relies on (:mod:`hvd_magics.horovod.patches`). This downloads its source, makes those
changes, builds a wheel with Gloo for the frameworks the environment has (TensorFlow, PyTorch,
or both; NCCL where PyTorch has CUDA and ``nvcc`` is there), installs it and checks it. The wheel
is kept in a cache keyed by everything it was built against, so a second environment of the same
Python and frameworks (another venv, a fresh clone, an executor's image) installs it in seconds.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from collections.abc import Callable

from hvd_magics.horovod import patches
from hvd_magics.protocol import (CUDA_HOME_VARIABLES, ENV_CACHE, ENV_GPU_OPERATIONS,
                                 ENV_TF_LOG_LEVEL, HOROVOD_BUILD_ALWAYS, HOROVOD_BUILD_FRAMEWORK)

HOROVOD_VERSION = "0.28.1"
#: The file an install of ours leaves in the horovod package: what it was built for.
STAMP = "hvd_magics_build.json"
#: Horovod's own C++ build needs these tools; the fix for each, per package manager.
TOOLS = {
    "gcc": "build-essential", "g++": "build-essential", "make": "build-essential",
    "cmake": "cmake",
}
CONDA_TOOLS = {"build-essential": "cxx-compiler make", "cmake": "'cmake<4'"}
#: Distributions that provide the ``tensorflow`` module.
TENSORFLOW_DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-macos",
                            "tf-nightly", "tf-nightly-cpu")


class BuildError(RuntimeError):
    """Horovod cannot be built here; the message names what is missing and the fix."""


@dataclass(frozen=True)
class Target:
    """What a Horovod build is made for: this Python, its frameworks, and the GPU operations."""

    python: str
    #: ``{"tensorflow": "2.21.0", "torch": "2.13.0"}``: the frameworks Horovod is built against.
    frameworks: dict
    #: ``"NCCL"`` for GPU collectives, or ``""`` for a CPU build (Gloo only).
    gpu_operations: str = ""

    def key(self) -> str:
        """16 hex digits naming this build in the cache (its patches included)."""
        text = json.dumps([asdict(self), HOROVOD_VERSION, patches.fingerprint()], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """``Python 3.11.7, tensorflow 2.21.0, torch 2.13.0, CPU (Gloo)``."""
        parts = [f"Python {self.python.split()[0]}",
                 *(f"{name} {version}" for name, version in sorted(self.frameworks.items()))]
        parts.append("GPU (NCCL and Gloo)" if self.gpu_operations else "CPU (Gloo)")
        return ", ".join(parts)


def framework_versions() -> dict[str, str]:
    """The frameworks of this environment that Horovod can be built against, without importing
    them."""
    found = {}
    if importlib.util.find_spec("tensorflow") is not None:
        for name in TENSORFLOW_DISTRIBUTIONS:
            try:
                found["tensorflow"] = importlib.metadata.version(name)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
    if importlib.util.find_spec("torch") is not None:
        found["torch"] = importlib.metadata.version("torch")
    return found


def wants_gpu(choice: str) -> str:
    """``"NCCL"`` when the build should carry GPU operations: ``choice`` is ``"gpu"``, or
    ``"auto"`` with a CUDA build of PyTorch and ``nvcc`` on the PATH (or in ``CUDA_HOME``)."""
    if choice == "cpu":
        return ""
    if choice == "gpu":
        return "NCCL"
    home = next((os.environ[name] for name in CUDA_HOME_VARIABLES if os.environ.get(name)), "")
    nvcc = shutil.which("nvcc") or (home and shutil.which("nvcc", path=os.path.join(home, "bin")))
    if not nvcc or importlib.util.find_spec("torch") is None:
        return ""
    cuda = subprocess.run([sys.executable, "-c", "import torch; print(torch.version.cuda or '')"],
                          capture_output=True, text=True).stdout.strip()
    return "NCCL" if cuda else ""


def target(gpu: str = "auto") -> Target:
    """What a build here would be made for.

    Raises
    ------
    BuildError
        When the environment has neither TensorFlow nor PyTorch.
    """
    frameworks = framework_versions()
    if not frameworks:
        raise BuildError(
            f"{sys.executable} has neither PyTorch nor TensorFlow, so there is nothing to build "
            "Horovod against. Fix: pip install torch (or tensorflow) into this environment "
            "first, then run this again.")
    return Target(python=sys.version, frameworks=frameworks, gpu_operations=wants_gpu(gpu))


def installed_target() -> dict | None:
    """What the Horovod installed here was built for, by this command (``None`` for another
    Horovod, or none)."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return None
    stamp = Path(next(iter(spec.submodule_search_locations))) / STAMP
    try:
        return json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None


def missing_tools() -> list[str]:
    """Lines naming each tool the build lacks, with the packages that bring it."""
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    lacking = [tool for tool in TOOLS if shutil.which(tool, path=path) is None]
    lines = []
    packages = sorted({TOOLS[tool] for tool in lacking})
    if lacking:
        lines.append(
            f"{', '.join(lacking)} not found. Fix: sudo apt-get install {' '.join(packages)} "
            f"(Debian/Ubuntu), or conda install -c conda-forge "
            f"{' '.join(CONDA_TOOLS[p] for p in packages)}"
            + (", or pip install 'cmake<4' for cmake alone" if "cmake" in lacking else ""))
    cmake = shutil.which("cmake", path=path)
    if cmake:
        version = subprocess.run([cmake, "--version"], capture_output=True, text=True).stdout
        major = version.split()[2].split(".")[0] if len(version.split()) > 2 else ""
        if major.isdigit() and int(major) >= 4:
            lines.append(f"{cmake} is CMake {version.split()[2]}, which refuses Horovod's vendored "
                         "Gloo. Fix: pip install 'cmake<4' into this environment")
    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if not headers.exists():
        lines.append(f"Python's headers ({headers}) are missing. Fix: sudo apt-get install "
                     "python3-dev (Debian/Ubuntu), or a Python from conda, which has them")
    return lines


def cache_root() -> Path:
    """Where built wheels and build logs are kept: ``$HVD_MAGICS_CACHE`` or
    ``~/.cache/hvd_magics``."""
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "hvd_magics")


def build(gpu: str = "auto", cache: Path | None = None, sdist: Path | None = None,
          force: bool = False, say: Callable[[str], None] = print) -> Target:
    """Build (or take from the cache) and install Horovod for this environment, then check it.

    Parameters
    ----------
    gpu : {"auto", "cpu", "gpu"}
        Whether the build carries NCCL operations for GPUs.
    cache : Path, optional
        The cache folder (default :func:`cache_root`).
    sdist : Path, optional
        Horovod 0.28.1's source archive, where pip cannot download it (offline).
    force : bool
        Install again even when the Horovod here was built for this very target.
    say : callable
        Where progress lines go.

    Returns
    -------
    Target
        What the installed Horovod was built for.

    Raises
    ------
    BuildError
        A tool is missing, the download or the build failed, or the result does not import.
    """
    wanted = target(gpu)
    key = wanted.key()
    installed = installed_target()
    if not force and installed and installed.get("key") == key:
        say(f"Horovod {HOROVOD_VERSION} is already built for this environment "
            f"({wanted.describe()}).")
        return wanted
    cache = cache or cache_root()
    wheels = cache / "wheels" / key
    if not list(wheels.glob("horovod-*.whl")):
        _build_wheel(wanted, wheels, cache / "logs" / f"horovod-build-{key}.log", sdist, say)
    else:
        say(f"installing the Horovod wheel built before for {wanted.describe()} ({wheels})")
    wheel = sorted(wheels.glob("horovod-*.whl"))[-1]
    _pip(["install", "--no-deps", "--force-reinstall", str(wheel)], cache / "logs" /
         "horovod-install.log", "install the Horovod wheel")
    check(wanted)
    _write_stamp(wanted, key)
    say(f"Horovod {HOROVOD_VERSION} is installed and works with {wanted.describe()}.")
    return wanted


def _build_wheel(wanted: Target, wheels: Path, log: Path, sdist: Path | None,
                 say: Callable[[str], None]) -> None:
    lacking = missing_tools()
    if lacking:
        raise BuildError("Building Horovod needs a C++ toolchain:\n  " + "\n  ".join(lacking))
    log.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="horovod-src-") as tmp:
        work = Path(tmp)
        if sdist is None:
            _pip(["download", "--no-binary", ":all:", "--no-deps", f"horovod=={HOROVOD_VERSION}",
                  "-d", str(work)], log,
                 f"download Horovod {HOROVOD_VERSION}'s source (offline? pass --sdist with "
                 f"horovod-{HOROVOD_VERSION}.tar.gz)")
            sdist = work / f"horovod-{HOROVOD_VERSION}.tar.gz"
        with tarfile.open(sdist) as archive:
            archive.extractall(work, filter="data")
        tree = work / f"horovod-{HOROVOD_VERSION}"
        patches.apply(tree)
        say(f"building Horovod {HOROVOD_VERSION} for {wanted.describe()}: about 15 minutes on 2 "
            f"cores, once (the wheel is kept in {wheels}); log: {log}")
        wheels.mkdir(parents=True, exist_ok=True)
        _pip(["wheel", "-v", "--no-build-isolation", "--no-deps", "-w", str(wheels), "."], log,
             "build Horovod", cwd=tree, env=_build_env(wanted))


def _build_env(wanted: Target) -> dict[str, str]:
    env = {**os.environ, **HOROVOD_BUILD_ALWAYS,
           "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
           "MAKEFLAGS": f"-j{os.cpu_count() or 1}"}
    for framework, (with_it, without_it) in HOROVOD_BUILD_FRAMEWORK.items():
        env[with_it if framework in wanted.frameworks else without_it] = "1"
    if wanted.gpu_operations:
        env[ENV_GPU_OPERATIONS] = wanted.gpu_operations
    return env


def _pip(args: list[str], log: Path, what: str, cwd: Path | None = None,
         env: dict | None = None) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        done = subprocess.run([sys.executable, "-m", "pip", *args], stdout=out,
                              stderr=subprocess.STDOUT, cwd=cwd, env=env)
    if done.returncode:
        raise BuildError(f"Could not {what}. What went wrong, from {log}:\n  "
                         + "\n  ".join(failure_lines(log.read_text(errors="replace"))))


#: A compiler's, linker's or make's line that says what failed (pip's own wrapping says nothing).
FAILURE_LINE = re.compile(r"error:|multiple definition|undefined reference|\*\*\* |^\s*ERROR")


def failure_lines(text: str, most: int = 12) -> list[str]:
    """The lines of a build log that say what failed (the first ``most``), or its last lines."""
    found = [line.strip()[:300] for line in text.splitlines()
             if FAILURE_LINE.search(line) and "subprocess-exited-with-error" not in line]
    return found[:most] or [line[:300] for line in text.splitlines()[-most:]]


def check(wanted: Target) -> None:
    """Import the installed Horovod with each framework of ``wanted`` in a fresh process.

    Raises
    ------
    BuildError
        When it does not import, or was built without Gloo.
    """
    modules = {"tensorflow": "horovod.tensorflow", "torch": "horovod.torch"}
    code = "; ".join(f"import {modules[f]} as m{i}; assert m{i}.gloo_built(), '{f}: no Gloo'"
                     for i, f in enumerate(sorted(wanted.frameworks)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, ENV_TF_LOG_LEVEL: "3"})
    if done.returncode:
        raise BuildError("Horovod was installed but does not import with "
                         f"{', '.join(sorted(wanted.frameworks))}:\n"
                         + "\n".join(done.stderr.strip().splitlines()[-8:]))


def _write_stamp(wanted: Target, key: str) -> None:
    importlib.invalidate_caches()
    spec = importlib.util.find_spec("horovod")
    # just installed into this Python and imported by check(): a package it finds
    assert spec is not None and spec.submodule_search_locations is not None
    folder = Path(next(iter(spec.submodule_search_locations)))
    (folder / STAMP).write_text(json.dumps({"key": key, **asdict(wanted),
                                            "horovod": HOROVOD_VERSION}, indent=1))
