"""The notebook's own Python environment, packed and sent to the executors, where the ranks run
in it (``hvd_magics.ship_environment()``, ``%hvd_env``).

The environment is packed with the tool made for its kind, venv-pack for a virtual environment
and conda-pack for a conda one (the prefix's ``conda-meta`` says which), into
``~/.cache/hvd_magics/envs/env-<key>.tar.gz``. The key is a hash of what is installed (each
distribution's name and version and its ``RECORD``'s size and time, so a rebuilt wheel of the same
version counts, as our Horovod build does), the Python version and the platform: a ``%pip
install`` changes it, and the next job packs and sends the new environment. Spark carries the
archive (``SparkContext.addArchive``; ``spark.addArtifacts(..., archive=True)`` on Spark Connect)
and unpacks it on every executor, once per application and key. The task finds it there and
starts its rank with the archive's interpreter (:mod:`hvd_magics.task.shipped_environment`);
the task itself still runs in the executor's own Python, which needs only pyspark and pyarrow
(hvd_magics travels by itself, :mod:`~hvd_magics.launch.package_shipping`).

venv-pack does not carry the interpreter: the executors need the same Python at the same path
(the task refuses otherwise, naming conda-pack, which carries it). Editable installs are left
out (venv-pack refuses them); hvd_magics' own travels as its zip, any other is refused by name.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import platform
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator

from hvd_magics.common.sizes import byte_size
from hvd_magics.errors import EnvironmentNotShippable
from hvd_magics.launch.package_shipping import cache_folder
from hvd_magics.launch.spark_session import executors_run_this_python, is_connect, send_once
from hvd_magics.notices import say
from hvd_magics.protocol import ENV_SHIPPED_ENVIRONMENT, ENV_SHIPPED_PYTHON

#: Environments larger than this (unpacked) are refused unless the limit is raised.
DEFAULT_LIMIT_GB = 10.0
#: gzip level of the archive: fast (level 1 packs about three times faster than venv-pack's
#: default 4 for a few per cent more bytes).
COMPRESS_LEVEL = 1
#: How often the cell's progress line is drawn again while packing.
PROGRESS_EVERY_S = 1.0
#: Folders inside an environment that are not part of it and never travel (relative to a
#: ``site-packages``): a pip-installed pyspark's standalone-worker folders (``work`` held 9.9 GB
#: of earlier unpacked environments on one machine) and its logs.
LEFT_OUT = ("pyspark/work", "pyspark/logs")
#: How many of the largest parts a refusal names.
LARGEST_SHOWN = 3


@dataclass(frozen=True)
class EnvironmentFacts:
    """What an environment is, as the driver sees it."""

    prefix: str
    kind: str  # "venv" or "conda"
    python: str  # "3.11"
    platform: str  # "Linux-x86_64"
    key: str  # the hash of what is installed (see the module's docstring)
    size: int  # bytes on disk, unpacked (-1: not measured; a walk of every file, 0.5 s for 5 GB)
    editable: tuple[str, ...]  # editable installs found (their .pth lines), other than ours
    #: The largest parts, measured with the size: (a package folder or a top folder, bytes).
    largest: tuple[tuple[str, int], ...] = ()

    @property
    def alias(self) -> str:
        """The folder the executors unpack it into."""
        return f"hvd_env_{self.key}"

    def describe(self) -> str:
        size = f"{byte_size(self.size)} unpacked, " if self.size >= 0 else ""
        return f"{self.kind} {self.prefix} (Python {self.python}, {size}key {self.key})"

    def measured(self) -> EnvironmentFacts:
        """These facts with the environment's size on disk (what travels: :data:`LEFT_OUT`
        not counted) and its largest parts."""
        if self.size >= 0:
            return self
        size = 0
        parts: dict[str, int] = {}
        for folder, subfolders, files in os.walk(self.prefix):
            subfolders[:] = [d for d in subfolders if not left_out(os.path.join(folder, d))]
            part = _part_of(self.prefix, folder)
            for name in files:
                with contextlib.suppress(OSError):
                    count = os.lstat(os.path.join(folder, name)).st_size
                    size += count
                    parts[part] = parts.get(part, 0) + count
        largest = tuple(sorted(parts.items(), key=lambda kv: -kv[1])[:LARGEST_SHOWN])
        return dataclasses.replace(self, size=size, largest=largest)


def left_out(path: str) -> bool:
    """Whether ``path`` (a folder or file in an environment) is in one of :data:`LEFT_OUT`."""
    _, found, inside = (path.replace(os.sep, "/") + "/").partition("/site-packages/")
    return bool(found) and inside.startswith(tuple(f"{folder}/" for folder in LEFT_OUT))


def _part_of(prefix: str, folder: str) -> str:
    """The part of the environment ``folder`` belongs to: a package folder in site-packages
    (``lib/python3.11/site-packages/torch``), else the prefix's top folder (``bin``)."""
    relative = os.path.relpath(folder, prefix).replace(os.sep, "/")
    pieces = relative.split("/")
    if "site-packages" in pieces:
        at = pieces.index("site-packages")
        return "/".join(pieces[:at + 2])
    return pieces[0] if relative != "." else "."


def _site_packages(prefix: Path) -> list[Path]:
    return sorted(p for p in prefix.glob("lib/python*/site-packages") if p.is_dir())


def _editable_installs(prefix: Path) -> tuple[str, ...]:
    """The ``.pth`` lines that point outside the prefix (what venv-pack calls editable), less
    hvd_magics' own (it travels as its zip)."""
    import hvd_magics

    ours = str(Path(hvd_magics.__file__).resolve().parents[1])
    found = []
    for site in _site_packages(prefix):
        for pth in site.glob("*.pth"):
            for line in pth.read_text(errors="replace").splitlines():
                line = line.strip()
                if not line or line.startswith(("#", "import ")):
                    continue
                where = os.path.normpath(os.path.join(site, line))
                if not where.startswith(str(prefix)) and where != ours:
                    found.append(f"{pth.name}: {line}")
    return tuple(found)


def environment_facts(prefix: str | os.PathLike | None = None,
                      measure: bool = False) -> EnvironmentFacts:
    """The facts of the environment at ``prefix`` (the kernel's own, ``sys.prefix``, by default);
    its size only when ``measure`` (every job asks for the key, which is quick).

    Raises
    ------
    EnvironmentNotShippable
        When ``prefix`` is neither a virtual environment nor a conda environment.
    """
    root = Path(prefix or sys.prefix).resolve()
    if (root / "conda-meta").is_dir():
        kind = "conda"
    elif (root / "pyvenv.cfg").is_file():
        kind = "venv"
    else:
        raise EnvironmentNotShippable(
            f"{root} is not a virtual environment or a conda environment, so it cannot be packed "
            "for the executors. Fix: run the notebook in a venv (python -m venv) or a conda "
            "environment, install what the job needs there, then ship_environment() again.")
    digest = hashlib.sha256(f"{sys.version_info[:2]}|{platform.machine()}".encode())
    for site in _site_packages(root):
        for entry in sorted(os.scandir(site), key=lambda e: e.name):
            if entry.name.endswith((".dist-info", ".egg-info")):
                record = Path(entry.path, "RECORD")
                stamp = record.stat() if record.exists() else entry.stat()
                digest.update(f"{entry.name}|{stamp.st_size}|{stamp.st_mtime_ns}\n".encode())
    facts = EnvironmentFacts(str(root), kind, f"{sys.version_info[0]}.{sys.version_info[1]}",
                             f"{platform.system()}-{platform.machine()}",
                             digest.hexdigest()[:16], -1, _editable_installs(root))
    return facts.measured() if measure else facts


@contextlib.contextmanager
def _ours_not_editable() -> Iterator[None]:
    """venv-pack refuses any ``.pth`` line outside the prefix; ours is left out of the archive
    (hvd_magics travels as its zip) and others were refused before, so its check is skipped."""
    from venv_pack import core

    check = core.check_no_editable_packages
    core.check_no_editable_packages = lambda context: None
    try:
        yield
    finally:
        core.check_no_editable_packages = check


#: Files of hvd_magics' own editable install, left out of a packed venv (it travels as its zip).
_OURS = ("_editable_impl_hvd_magics.pth", "__editable__.hvd_magics")


class _Cancelled(Exception):
    """The pack was stopped (the user interrupted the call that waited for it)."""


@dataclass
class _Packing:
    """One pack under way, in a thread of its own: a later call for the same archive waits
    for it rather than start another beside it."""

    facts: EnvironmentFacts
    part: Path
    done: list[int] = dataclasses.field(default_factory=lambda: [0])
    finished: threading.Event = dataclasses.field(default_factory=threading.Event)
    cancel: threading.Event = dataclasses.field(default_factory=threading.Event)
    failure: list[BaseException] = dataclasses.field(default_factory=list)
    started: float = dataclasses.field(default_factory=time.monotonic)


#: The packs under way in this process, by archive.
_PACKING: dict[Path, _Packing] = {}
_PACKING_LOCK = threading.Lock()
#: How long an interrupted wait gives the pack to stop before it returns (a conda pack cannot
#: be stopped between files: it goes on, and the next call waits for it).
STOP_WAIT_S = 5.0


def _pack(facts: EnvironmentFacts, part: Path, done: list[int],
          cancel: threading.Event | None = None) -> None:
    """Pack the environment into ``part``; ``done[0]``: the bytes of its files packed so far;
    ``cancel`` set stops a venv's pack at its next file (raises :class:`_Cancelled`)."""
    if facts.kind == "conda":
        import conda_pack

        conda_pack.pack(prefix=facts.prefix, output=str(part), format="tar.gz",
                        compress_level=COMPRESS_LEVEL, force=True, ignore_editable_packages=True,
                        ignore_missing_files=True,
                        filters=[("exclude", f"lib/python*/site-packages/{folder}/*")
                                 for folder in LEFT_OUT])
        return
    from venv_pack import core, formats

    with _ours_not_editable():
        env = core.Env(facts.prefix)
    files = [f for f in env.files if not os.path.basename(f.target).startswith(_OURS)
             and not left_out(f.source)]
    with open(part, "wb") as out, formats.archive(out, "tar.gz", COMPRESS_LEVEL) as archive:
        packer = core.Packer(env._context, archive, None)  # noqa: SLF001 - venv-pack's own pack
        for file in files:  # venv-pack's pack(), with the bytes counted as they go
            if cancel is not None and cancel.is_set():
                raise _Cancelled()
            packer.add(file)
            with contextlib.suppress(OSError):
                done[0] += os.lstat(file.source).st_size
        packer.finish()


def _start_packing(facts: EnvironmentFacts, target: Path) -> _Packing:
    """The pack of ``target`` under way, started now unless one is."""
    with _PACKING_LOCK:
        packing = _PACKING.get(target)
        if packing is not None and not packing.finished.is_set():
            return packing
        packing = _Packing(facts, target.with_name(
            f".{target.name}.part-{os.getpid()}-{uuid.uuid4().hex[:8]}"))
        _PACKING[target] = packing

    def pack() -> None:
        try:
            _pack(facts, packing.part, packing.done, packing.cancel)
            os.replace(packing.part, target)  # whole or absent
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            packing.failure.append(exc)
        finally:
            packing.part.unlink(missing_ok=True)
            with _PACKING_LOCK:
                if _PACKING.get(target) is packing:
                    del _PACKING[target]
            packing.finished.set()

    threading.Thread(target=pack, daemon=True, name="hvd_magics-pack").start()
    return packing


def packed_environment(facts: EnvironmentFacts, say: Callable[..., None],
                       limit_gb: float = DEFAULT_LIMIT_GB) -> Path:
    """The archive of the environment, packed now unless one of its key is cached (or waited
    for, when another call of this process is packing it); ``say`` shows what is being done (a
    line redrawn every second while packing). An interrupt stops the pack.

    Raises
    ------
    EnvironmentNotShippable
        Editable installs other than hvd_magics, or more than ``limit_gb`` unpacked.
    KeyboardInterrupt
        The wait was interrupted; the pack was stopped (a conda pack goes on, and the next
        call waits for it).
    """
    target = cache_folder("envs") / f"env-{facts.key}.tar.gz"
    if target.exists():
        return target
    facts = facts.measured()
    if facts.editable:
        raise EnvironmentNotShippable(
            "the environment has editable installs that cannot travel to the executors: "
            + "; ".join(facts.editable) + ". Fix: install them without -e (pip install .), or "
            "add their folders with spark.sparkContext.addPyFile, then ship_environment() again.")
    if facts.size > limit_gb * 1e9:
        largest = ", ".join(f"{part} {byte_size(count)}" for part, count in facts.largest)
        raise EnvironmentNotShippable(
            f"the environment is {byte_size(facts.size)} unpacked, over the limit of "
            f"{limit_gb:g} GB "
            f"that every executor would download and unpack (largest: {largest}). Fix: remove "
            "what the job does not need, or raise the limit: "
            f"ship_environment(limit_gb={max(facts.size / 1e9 * 1.2, 1):.0f}).")
    target.parent.mkdir(parents=True, exist_ok=True)
    tool = "conda-pack" if facts.kind == "conda" else "venv-pack"
    packing = _start_packing(facts, target)
    try:
        while not packing.finished.wait(PROGRESS_EVERY_S):
            done = packing.done[0]
            what = (f"{byte_size(done)} of {byte_size(facts.size)}" if facts.kind == "venv"
                    else f"{byte_size(_written(packing.part))} written, "
                         f"{byte_size(facts.size)} unpacked")
            say(f"packing {facts.prefix} with {tool}: {what}, "
                f"{time.monotonic() - packing.started:.0f} s", redraw=True)
    except KeyboardInterrupt:
        packing.cancel.set()
        stopped = packing.finished.wait(STOP_WAIT_S)
        say(f"packing {facts.prefix} was interrupted" + (
            "; stopped" if stopped else
            f"; {tool} goes on in the background, and the next ship_environment() or job "
            "waits for it"))
        raise
    if packing.failure and not target.exists():
        failure = packing.failure[0]
        raise EnvironmentNotShippable(f"{tool} could not pack {facts.prefix}: "
                                      f"{type(failure).__name__}: {failure}") from failure
    say(f"packed {facts.prefix} with {tool}: {byte_size(target.stat().st_size)} in "
        f"{time.monotonic() - packing.started:.1f} s")
    return target


def _written(part: Path) -> int:
    try:
        return part.stat().st_size
    except OSError:
        return 0


@dataclass
class EnvironmentChoice:
    """The user's choice to ship an environment (``prefix``: the kernel's own by default)."""

    prefix: str | None = None
    limit_gb: float = DEFAULT_LIMIT_GB
    #: The facts of the environment last shipped (for ``%hvd_env`` and to notice a change).
    shipped: EnvironmentFacts | None = None
    #: Bytes of the archive the last :meth:`for_job` sent (0: the executors had it already).
    sent_now: int = 0

    def __repr__(self) -> str:
        """One line (a notebook shows what ``ship_environment()`` returns, after what it
        said): what is shipped, by its folder and key once a job sent it."""
        folder = self.prefix or sys.prefix
        sent = f"sent as key {self.shipped.key}" if self.shipped else "not sent to a cluster yet"
        return f"<shipped environment {folder}: {sent}>"

    def archive_bytes(self) -> int:
        """The size of the archive last shipped (0: none yet)."""
        if self.shipped is None:
            return 0
        archive = cache_folder("envs") / f"env-{self.shipped.key}.tar.gz"
        return archive.stat().st_size if archive.exists() else 0

    def udf_python(self, spark: Any, say: Callable[..., None] = say) -> str | None:
        """The interpreter a classic session's Python functions (the estimator's transform)
        run in on a cluster when the environment is shipped: the archive's, in the executor's
        working folder where Spark unpacks it (sent now if it was not). ``None`` on a local
        master and on Spark Connect, whose server chooses its workers' Python."""
        if is_connect(spark) or executors_run_this_python(spark):
            return None
        return f"./{self.for_job(spark, say)[ENV_SHIPPED_ENVIRONMENT]}/bin/python"

    def for_job(self, spark: Any, say: Callable[..., None] = say) -> dict[str, str]:
        """Pack (when what is installed changed) and send (once per application) the environment
        for a job on ``spark``; the task's environment variables that name it. Nothing for a
        local master: its executors are this machine, running this very Python."""
        if executors_run_this_python(spark):
            return {}
        facts = environment_facts(self.prefix)
        if self.shipped is not None and self.shipped.key != facts.key:
            say(f"the environment changed since it was last shipped (key {self.shipped.key} "
                f"-> {facts.key}): packing and sending it again")
        archive = packed_environment(facts, say, self.limit_gb)
        started = time.monotonic()
        self.sent_now = 0
        if send_once(spark, f"{archive}#{facts.alias}", "archive"):
            self.sent_now = archive.stat().st_size
            say(f"sent the environment to the executors ({byte_size(self.sent_now)}, "
                f"{time.monotonic() - started:.1f} s; Spark unpacks it on each)")
        self.shipped = facts
        return {ENV_SHIPPED_ENVIRONMENT: facts.alias, ENV_SHIPPED_PYTHON: facts.python}
