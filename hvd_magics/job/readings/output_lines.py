"""Sort the ranks' output lines: what the cell shows, what is a rank's live line, what only the
run log keeps.

Every line reaches the run log whatever its sort. The cell is spared:

- framework start-up chatter (:mod:`hvd_magics.job.readings.noise`);
- progress bars: tqdm's (``45%|####   | 9/20 [00:01<00:01, 8.1it/s]``) and any bar redrawn with
  cursor codes (rich's, Lightning's ``RichProgressBar``) become the rank's live line, as a bar
  drawn with carriage returns already is; the codes that move the cursor never reach the cell
  (colour codes stay: notebooks and terminals render them);
- warnings, Python's (``/path/mod.py:12: UserWarning: ...`` and the source line after it) and
  PyTorch's C++ ones (``[rank0]:[W1126 07:05:11.16 reducer.cpp:1529] Warning: ...``): the first
  of each kind is shown as one short line (hvd_magics' own, ``HorovodMagicsWarning`` at the
  user's line, whole: they end with the fix), its copies (from the other ranks, or later) are
  not;
- a line that another rank already showed (every rank prints the same banner), the times of
  day in it aside (a logger's ``[2026-11-29 02:16:43,398] [WARNING] ...``): shown once;
- in a job of more than :data:`FEW_RANKS` ranks, a line alike but for its numbers to one
  another rank showed (each rank's ``32/32 - 1s - loss: 0.3121`` at the end of an epoch: 66
  lines for 16 ranks and 3 epochs): held back, and once every rank printed its own, one line
  says what differs between them (``ranks 1-15 alike: loss: 0.3011 to 0.3312``).

:meth:`OutputSorter.left_out` says in one line what was kept from the cell, where it is.
"""
from __future__ import annotations

import collections
import re
from typing import NamedTuple

from hvd_magics.errors import HorovodMagicsWarning
from hvd_magics.job.readings.noise import is_noise
from hvd_magics.rank_names import rank_spans

#: The sorts of a line.
SHOW, BAR, NOISE, WARNING, REPEAT = "show", "bar", "noise", "warning", "repeat"
#: ...and one held back: alike, but for its numbers, to one another rank showed.
ALIKE = "alike"
#: Up to this many ranks, every rank's own line is shown.
FEW_RANKS = 4
#: Rounds of one shape of line kept waiting for every rank's line.
ROUNDS_KEPT = 8
#: What stands for each number in a line's shape (no line holds it).
_SLOT = "\x00"
#: A number in a line (what may differ between ranks' lines alike).
_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:e[-+]?\d+)?")

#: A control sequence that moves the cursor or erases (``ESC[2K``, ``ESC[1A``, ``ESC[?25h``): a
#: redraw in place. Colour codes (``ESC[...m``) are not among them.
_CURSOR = re.compile(r"\x1b\[\??[0-9;]*[A-HJKSTfhlsu]")
#: tqdm's bar with a total (``desc: 45%|####  | 9/20 [00:01<00:01, 8.10it/s]``) or without
#: one (``desc: 120it [00:03, 39.9it/s]``).
_TQDM = re.compile(r"^(?:.*: ?)?\s*\d{1,3}%\|.*\|\s*\S+/\S+ \[[\d:?]+<[\d:?-]+"
                   r"|^(?:.*: )?\d+(?:\.\d+)?[kMGT]?(?:it|B) \[\d+:\d\d(?::\d\d)?, ")
#: Python's warning line (``warnings.formatwarning``; Lightning drops the category), at a file
#: or at a cell's pseudo-file (``<%%horovod cell>:7: ...``: hvd_magics' own warnings say the
#: user's line).
_PY_WARNING = re.compile(r"^(?P<path>(?:[A-Za-z]:)?[/\\][^:]*\.py|<%%horovod cell(?: \d+)?>)"
                         r":(?P<line>\d+): "
                         r"(?:(?P<category>[A-Z]\w*(?:Warning|Deprecation\w*)): )?(?P<message>.+)$")
#: The source line Python prints under a warning.
_PY_WARNING_SOURCE = re.compile(r"^  \S")
#: A C++ warning of PyTorch's (``TORCH_WARN``), perhaps after a progress bar's unfinished line.
_CPP_WARNING = re.compile(r"(?:\[rank\d+\]:)?\[W(?:\d{4} [\d:.]+(?: \d+)? )?"
                          r"(?P<path>[\w.-]+):(?P<line>\d+)\] (?:Warning: )?(?P<message>.+)$")
#: A date and time of day in a line (a logger's record): ranks print the same record at
#: different times.
_DATE_TIME = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?")
#: Characters of a library's warning message the cell shows (the run log has it whole);
#: hvd_magics' own (:data:`OWN_WARNING`) are shown whole: they end with the fix.
WARNING_CHARS = 240
#: The category of hvd_magics' own warnings, as a warning's line names it.
OWN_WARNING = HorovodMagicsWarning.__name__
#: Characters of the longest line sorted (longer ones are shown, cut, as any line).
LONGEST_SORTED = 4000
#: Lines of the ranks remembered to fold another rank's copy.
REMEMBERED_LINES = 2000


class Sorted(NamedTuple):
    """One output line, sorted: its sort, and the text the cell (or the live line) shows."""

    sort: str
    text: str


#: Any control sequence, colours too.
_ANY_CODE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
#: A bar's count: ``9/20 [`` (tqdm) or `` 9/20 `` with a rate or time after it (rich).
_BAR_COUNT = re.compile(r"(?:^|[\s|])(\d+)/(\d+)(?: \[| \d+:\d\d| [\d.]+it/s)")


def bar_count(text: str) -> tuple[int, int] | None:
    """``(done, total)`` of a progress bar's line (``None`` when it shows no count)."""
    match = _BAR_COUNT.search(_ANY_CODE.sub("", text))
    if not match or int(match.group(2)) <= 0:
        return None
    return int(match.group(1)), int(match.group(2))


def plain(text: str) -> str:
    """``text`` without its cursor codes (what remains is what the line shows)."""
    return _CURSOR.sub("", text)


def _short_path(path: str) -> str:
    """A library file's path from its package (``accelerate/state.py``), else its last two
    parts."""
    for root in ("site-packages", "dist-packages"):
        if f"{root}/" in path or f"{root}\\" in path:
            return re.split(rf"{root}[/\\]", path)[-1]
    return "/".join(re.split(r"[/\\]", path)[-2:])


class OutputSorter:
    """Sort one job's output lines, remembering what it already showed."""

    def __init__(self, ranks: int = 1) -> None:
        #: Kinds of warning shown, and how many copies of them were kept from the cell.
        self._warnings: set[tuple[str, str]] = set()
        self.warning_copies = 0
        #: Lines shown lately and the rank that showed each.
        self._shown: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.repeats = 0
        #: Ranks whose last line was a Python warning (its source line comes next).
        self._after_warning: set[int] = set()
        #: The job's ranks (lines alike are folded above :data:`FEW_RANKS`).
        self.ranks = ranks
        #: Shape (a line's text, numbers left out) -> its rounds, oldest first: each rank's
        #: numbers in its line of that round so far.
        self._alike: collections.OrderedDict[str, list[dict[int, list[str]]]] = \
            collections.OrderedDict()
        self.alike = 0

    def sort(self, rank: int, line: str, peer_lost: bool = False) -> Sorted:
        """The sort of ``rank``'s complete output ``line`` (a line longer than
        :data:`LONGEST_SORTED` is shown: a bar or a warning is never that long)."""
        after_warning = rank in self._after_warning
        self._after_warning.discard(rank)
        if len(line) > LONGEST_SORTED:
            return Sorted(SHOW, line)
        if is_noise(line, peer_lost):
            return Sorted(NOISE, line)
        if after_warning and _PY_WARNING_SOURCE.match(line):
            return Sorted(NOISE, line)
        warning = _PY_WARNING.match(line)
        if warning:
            if warning.group("category"):
                self._after_warning.add(rank)
            return self._warning(warning.group("category") or "warning", warning)
        warning = _CPP_WARNING.search(line)
        if warning:  # perhaps after a bar's unfinished line: the warning is what stays
            return self._warning("warning", warning)
        if _CURSOR.search(line):
            text = plain(line)
            return Sorted(BAR, text) if text.strip() else Sorted(NOISE, line)
        if _TQDM.match(line):
            return Sorted(BAR, line)
        said = _DATE_TIME.sub("", line)
        first = self._shown.get(said)
        if first is not None and first != rank:
            self.repeats += 1
            return Sorted(REPEAT, line)
        folded = self._fold(rank, said) if self.ranks > FEW_RANKS else None
        if folded is not None:
            return folded
        self._shown[said] = rank
        self._shown.move_to_end(said)
        if len(self._shown) > REMEMBERED_LINES:
            self._shown.popitem(last=False)
        return Sorted(SHOW, line)

    def _fold(self, rank: int, line: str) -> Sorted | None:
        """A line alike but for its numbers to one another rank showed: held back (``ALIKE``)
        until every rank printed its own of that round, then one line of what differs
        (``SHOW``); ``None`` for the first line of a round (shown) or a line with no number.
        A rank that prints the next round's line before the others printed this one's starts
        that round: each rank's lines join the oldest round it is not in yet."""
        numbers = _NUMBER.findall(line)
        if not numbers:
            return None
        shape = _NUMBER.sub(_SLOT, line)
        rounds = self._alike.setdefault(shape, [])
        self._alike.move_to_end(shape)
        if len(self._alike) > REMEMBERED_LINES:
            self._alike.popitem(last=False)
        for i, group in enumerate(rounds):
            if rank in group:
                continue
            group[rank] = numbers
            self.alike += 1
            if len(group) < self.ranks:
                return Sorted(ALIKE, line)
            del rounds[i]
            first = next(iter(group))
            return Sorted(SHOW, alike_line(shape, {r: n for r, n in group.items() if r != first}))
        rounds.append({rank: numbers})  # a new round, its first line shown
        del rounds[:-ROUNDS_KEPT]  # one a rank never finished (it ended) is given up
        return None

    def _warning(self, category: str, match: re.Match[str]) -> Sorted:
        where = f"{_short_path(match.group('path'))}:{match.group('line')}"
        message = re.sub(r" \(function [^)]*\)$", "", match.group("message").strip())
        if (where, message) in self._warnings:
            self.warning_copies += 1
            return Sorted(REPEAT, message)
        self._warnings.add((where, message))
        if len(message) > WARNING_CHARS and category != OWN_WARNING:
            message = message[:WARNING_CHARS].rstrip() + " ..."
        return Sorted(WARNING, f"{category} ({where}): {message}")

    def left_out(self, log_path: object) -> str | None:
        """One line saying which copies the cell did not show, and where they are; ``None``
        when it showed every line it was meant to."""
        parts = []
        if self.warning_copies:
            parts.append(f"{self.warning_copies} more {_plural(self.warning_copies, 'copy')} "
                         "of the warnings above")
        if self.repeats:
            parts.append(f"{self.repeats} {_plural(self.repeats, 'line')} another rank had "
                         "already shown")
        if self.alike:
            parts.append(f"{self.alike} {_plural(self.alike, 'line')} alike to another "
                         "rank's but for their numbers")
        if not parts:
            return None
        return f"hvd_magics: not shown here, in {log_path}: {' and '.join(parts)}"


def alike_line(shape: str, numbers: dict[int, list[str]]) -> str:
    """What the ranks' lines of ``shape`` (:data:`_SLOT` for each number) say, ``numbers``
    being each rank's: ``ranks 1-15 alike: 32/32 - 1s - loss: 0.3011 to 0.3312``, a number the
    same on every rank as it is."""
    columns = list(zip(*numbers.values()))
    parts = shape.split(_SLOT)
    text = parts[0]
    for column, after in zip(columns, parts[1:]):
        values = sorted(set(column), key=float)
        text += values[0] if len(values) == 1 else f"{values[0]} to {values[-1]}"
        text += after
    return f"{rank_spans(numbers)} alike: {text}"


def _plural(count: int, word: str) -> str:
    if count == 1:
        return word
    return word[:-1] + "ies" if word.endswith("y") else word + "s"
