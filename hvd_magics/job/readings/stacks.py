"""Where each rank is: the stacks the ranks sent on request, read as a person would.

A ``stacks`` event (:mod:`hvd_magics.rank.instruments.stack_report`) gives a rank's threads, each a
list of frames ``[file, line, function, code, kind]`` from outermost to innermost.
:class:`JobStacks` keeps one per rank and prints them (the user's frames marked ``>``);
:func:`where` says in a few words where a rank is: its innermost frame of the user's, and the
library call it waits in. Ranks in the same place are said once, as py-spy and NCCL's flight
recorder group theirs: at 64 ranks, ``ranks 0-62: ... allreduce``, ``rank 63: ... next(loader)``.
"""
from __future__ import annotations

import functools
import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from hvd_magics.rank_names import ranks_named

#: ``.../site-packages/horovod/torch/mpi_ops.py`` is shown as ``horovod/torch/mpi_ops.py``.
_PACKAGE_ROOT = re.compile(r".*[\\/](?:site|dist)-packages[\\/]")
#: How long the driver waits for the ranks' stacks (a stall, ``--timeout``, ``%hvd_stacks``).
STACKS_WAIT_S = 2.0
#: Most frames printed per thread (the innermost).
SHOWN_FRAMES = 12
#: The files of each engine's collectives: a rank whose innermost frame is in one waits for its
#: peers.
_COLLECTIVES = (
    ("Horovod", re.compile(r"horovod[\\/](torch|tensorflow|keras|_keras)[\\/]")),
    ("torch.distributed", re.compile(
        r"torch[\\/](distributed[\\/]|nn[\\/]parallel[\\/]distributed\.py)")),
    ("tf.distribute", re.compile(r"tensorflow[\\/]python[\\/](distribute|ops[\\/]collective)")),
)

#: Python's own library (``.../lib/python3.11/threading.py``), not the packages installed into it.
_STANDARD_LIBRARY = re.compile(r"[\\/]lib[\\/]python3\.\d+[\\/](?!site-packages|dist-packages)")
#: A DDP rank inside the ``backward()`` of a training step (autograd's frames innermost) waits at
#: its end for every rank's gradients: DDP's allreduce, run from autograd's hooks.
_AUTOGRAD = re.compile(r"torch[\\/]autograd[\\/]")
#: What :func:`collective_waited` calls that wait.
DDP_ALLREDUCE = "DDP's gradient allreduce"

#: Collective calls whose names say which collective a rank is in (a rank waiting on an
#: asynchronous one's ``wait`` may be in any).
_NAMED_CALLS = frozenset({"all_reduce", "broadcast", "all_gather", "all_gather_into_tensor",
                          "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
                          "reduce_scatter_single", "reduce", "gather",
                          "scatter", "all_to_all", "all_to_all_single", "barrier",
                          "broadcast_object_list", "all_gather_object", "gather_object",
                          "scatter_object_list", "allreduce", "allgather", "alltoall",
                          "broadcast_"})


def short_path(path: str) -> str:
    """A frame's file as it reads best: a package-relative path, a cell's name, a file name."""
    if path.startswith("<"):
        return path
    shortened = _PACKAGE_ROOT.sub("", path)
    if shortened != path:
        return shortened
    return path if len(path) < 60 else os.path.join("...", *path.split(os.sep)[-2:])


def _place(frame: list[Any]) -> str:
    file, line, function = frame[0], frame[1], frame[2]
    return f"{short_path(file)}:{line} {function}"


def where(threads: list[dict[str, Any]]) -> str:
    """Where the main thread is, in a line: ``<%%horovod cell 2>:7 train_step
    (loss = hvd.allreduce(loss)), in horovod/torch/mpi_ops.py:1285 synchronize``."""
    frames = _main_frames(threads)
    if not frames:
        return "no Python frame (it runs native code or has not started)"
    users = [i for i, f in enumerate(frames) if f[4] == "user"]
    if not users:
        return f"{_place(frames[-1])} (no frame of yours)"
    at = users[-1]
    user = frames[at]
    text = _place(user) + (f" ({user[3]})" if user[3] else "")
    if at < len(frames) - 1:
        text += f", in {_place(frames[-1])}"
    return text


def _main_frames(threads: list[dict[str, Any]]) -> list[list[Any]]:
    main = next((t for t in threads if t.get("main")), threads[0] if threads else None)
    return main["frames"] if main else []


def collective_of(threads: list[dict[str, Any]]) -> str:
    """Whose collective the main thread waits in (its innermost frame outside Python's own
    library is Horovod's, torch.distributed's or tf.distribute's: tf.distribute's eager
    ``reduce`` waits in ``threading``): that engine's name, else ``""``."""
    frames = [frame for frame in _main_frames(threads) if not _STANDARD_LIBRARY.search(frame[0])]
    if not frames:
        return ""
    return next((name for name, files in _COLLECTIVES if files.search(frames[-1][0])), "")


def collective_waited(answer: dict[str, Any]) -> str:
    """What a rank's ``stacks`` answer waits in: an engine's collective (:func:`collective_of`),
    or :data:`DDP_ALLREDUCE` when it is inside the ``backward()`` of a DDP training step
    (:mod:`hvd_magics.rank.instruments.ddp_watch`); else ``""``."""
    threads = answer.get("threads", [])
    engine = collective_of(threads)
    if engine:
        return engine
    frames = _main_frames(threads)
    syncing = bool((answer.get("ddp") or {}).get("syncing"))
    return DDP_ALLREDUCE if syncing and frames and _AUTOGRAD.search(frames[-1][0]) else ""


def collective_call(threads: list[dict[str, Any]]) -> str:
    """The named collective call the main thread waits in (``all_reduce``), else ``""``."""
    frames = _main_frames(threads)
    if not frames or not collective_of(threads):
        return ""
    return next((f[2] for f in reversed(frames) if f[2] in _NAMED_CALLS), "")



@dataclass
class JobStacks:
    """Each rank's stacks, taken together on request.

    Attributes
    ----------
    ranks : dict
        Rank -> its ``stacks`` event (``threads``, ``others``, ``host``).
    missing : list of int
        Running ranks that did not answer in time (stuck in native code that holds the GIL, or
        their task cannot be reached).
    seconds : float
        How long taking them took.
    starting : list of int
        Ranks whose process had not started yet (nothing to ask).
    straggler : str
        The rank (or host) the others wait for, as its steps' split found it when the stacks
        were taken (:mod:`hvd_magics.job.verdicts.straggler`); ``""`` when none was found.
    """

    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)
    missing: list[int] = field(default_factory=list)
    seconds: float = 0.0
    starting: list[int] = field(default_factory=list)
    straggler: str = ""

    def where(self) -> dict[int, str]:
        """Rank -> where its main thread is, in a line (:func:`where`)."""
        found = {rank: where(event.get("threads", [])) for rank, event in self.ranks.items()}
        found.update({rank: "did not answer (busy in native code that holds the GIL?)"
                      for rank in self.missing})
        found.update({rank: "starting (its process has not begun the job yet)"
                      for rank in self.starting})
        return dict(sorted(found.items()))

    def diagnosis(self, unit: str = "rank") -> str:
        """The rank the others wait for, when the steps' split found one (the evidence of
        many steps: one look at the stacks of a job that is only slow finds its fast ranks in
        a collective and the slow one elsewhere); else, when some ranks wait in a collective
        and others are elsewhere: ``ranks 0 wait in a Horovod collective for rank 1, which is
        elsewhere (see below)``."""
        return self.straggler or self._elsewhere(unit)

    def _elsewhere(self, unit: str) -> str:
        engines = {r: collective_of(e.get("threads", [])) for r, e in self.ranks.items()}
        waiting = sorted(r for r, name in engines.items() if name)
        elsewhere = sorted(set(self.ranks) - set(waiting)) + list(self.missing)
        if not waiting or not elsewhere:
            return ""
        names = functools.partial(ranks_named, unit=unit)
        verb = "wait" if len(waiting) > 1 else "waits"
        engine = engines[waiting[0]]
        return (f"{names(waiting)} {verb} in a {engine} collective for {names(elsewhere)}, "
                f"which {'are' if len(elsewhere) > 1 else 'is'} elsewhere and never entered it")

    def mismatch(self, unit: str = "rank") -> str:
        """In words, when every rank waits in a named collective and not all in the same one
        (``rank 0 waits in all_reduce, rank 1 in broadcast``): they never meet; else ``""``."""
        calls = {r: collective_call(e.get("threads", [])) for r, e in self.ranks.items()}
        if self.missing or self.starting or len(calls) < 2 or not all(calls.values()) \
                or len(set(calls.values())) == 1:
            return ""
        places = self.where()
        (first, ranks), *rest = _grouped(
            {rank: f"{call} ({places[rank]})" for rank, call in sorted(calls.items())}).items()
        verb = "wait" if len(ranks) > 1 else "waits"
        return (f"{ranks_named(ranks, unit)} {verb} in {first}, "
                + ", ".join(f"{ranks_named(others, unit)} in {call}" for call, others in rest)
                + ": these collectives never meet")

    def summary(self, unit: str = "rank") -> str:
        """A line per place (the ranks there, and where that is), and the diagnosis when there
        is one."""
        lines = [f"  {ranks_named(ranks, unit)}: {text}"
                 for text, ranks in _grouped(self.where()).items()]
        diagnosis = self.diagnosis(unit)
        return "\n".join(lines + ([f"  So: {diagnosis}."] if diagnosis else []))

    def __str__(self) -> str:
        parts = []
        alike = _grouped({rank: _stack_key(event) for rank, event in sorted(self.ranks.items())})
        for ranks in alike.values():
            event = self.ranks[ranks[0]]
            hosts = sorted({str(self.ranks[rank].get("host", "?")) for rank in ranks})
            on = (", ".join(hosts) if len(hosts) <= 3
                  else f"{len(hosts)} hosts: {', '.join(hosts[:2])}, ...")
            parts.append(f"{ranks_named(ranks)} ({on})"
                         + (" have this stack:" if len(ranks) > 1 else ":"))
            for thread in event.get("threads", []):
                frames = thread.get("frames", [])
                parts.append(f"  thread {thread.get('name')}"
                             + (f" ({len(frames) - SHOWN_FRAMES} outer frames left out)"
                                if len(frames) > SHOWN_FRAMES else ""))
                for frame in frames[-SHOWN_FRAMES:]:
                    mark = ">" if frame[4] == "user" else " "
                    parts.append(f"  {mark} {_place(frame)}")
                    if frame[3]:
                        parts.append(f"        {frame[3]}")
            if event.get("others"):
                parts.append(f"  (and {event['others']} more thread(s) with no frame of yours)")
        if self.missing:
            parts.append(f"{ranks_named(self.missing)}: did not answer within the wait (busy in "
                         "native code that holds Python's lock?)")
        if self.starting:
            parts.append(f"{ranks_named(self.starting)}: starting (the process has not begun the "
                         "job yet)")
        if not parts:
            return "No rank runs now."
        if self.diagnosis():
            parts.append(f"So: {self.diagnosis()}.")
        parts.append(f"(taken in {self.seconds:.2f} s; '>' marks your frames)")
        return "\n".join(parts)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # noqa: FBT001 - IPython's API
        printer.text(str(self))


def _grouped(values: dict[int, Any]) -> dict[Any, list[int]]:
    """Rank -> value, as value -> its ranks, in the order of each value's first rank."""
    groups: dict[Any, list[int]] = {}
    for rank, value in sorted(values.items()):
        groups.setdefault(value, []).append(rank)
    return groups


def _stack_key(event: dict[str, Any]) -> tuple:
    """What makes two ranks' stacks the same: each thread's name and the place of each of its
    frames (file, line, function), and how many threads were left out."""
    return (tuple((str(thread.get("name")), tuple((f[0], f[1], f[2])
                                                   for f in thread.get("frames", [])))
                  for thread in event.get("threads", [])), event.get("others"))


class StackSource(Protocol):
    """What answers a request for stacks (a job's backend)."""

    def request_stacks(self, request: str) -> None: ...


class StackRequests:
    """The ranks' stacks asked for (a request id each) and their answers, request id -> rank
    -> its ``stacks`` event."""

    def __init__(self) -> None:
        self.answers: dict[str, dict[int, dict[str, Any]]] = {}

    def ask(self, backend: StackSource, prefix: str = "") -> str:
        """Ask ``backend``'s ranks for their stacks; the request id, whose answers
        :attr:`answers` gathers."""
        request = f"{prefix}{uuid.uuid4().hex[:8]}"
        self.answers[request] = {}
        backend.request_stacks(request)
        return request

    def answer(self, rank: int, event: dict[str, Any]) -> None:
        """A rank's answer (to a request of ours or not)."""
        self.answers.setdefault(str(event.get("request")), {})[rank] = event
