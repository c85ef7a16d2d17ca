"""How a magic's line becomes its arguments, the same for every magic: split as a shell splits
(quotes removed, ``"/tmp/a b"`` one word, a trailing ``# comment`` dropped), HorovodRunner-style
``np=4`` words read as ``--np 4``, an option given twice refused however it was spelt
(``np=2 --np 3``), and argparse's own words put in one ``UsageError`` line that names the magic,
the option and the fix. What a value may be is :mod:`hvd_magics.options`' to say."""
from __future__ import annotations

import argparse
import re
import shlex
from typing import Any
from collections.abc import Callable, Sequence

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument

#: ``key=value`` words (``np=4``, ``start_timeout=30``).
_KEY_VALUE = re.compile(r"^([A-Za-z_][\w-]*)=(.*)$", re.DOTALL)
#: Where the parsed namespace keeps each option's first value while a line is parsed.
_GIVEN = "_given_once"


class _Repeated(Exception):
    """An option given twice on one line."""

    def __init__(self, option: str, first: Any, second: Any) -> None:
        values = "" if first is None else f" ({first!r}, then {second!r})"
        super().__init__(f"{option} is given twice{values}")


class _Once(argparse.Action):
    """Store an option's value, refusing a second one (:class:`_Repeated`); ``many`` appends
    each instead (``--env`` takes several); ``nargs=0`` stores ``const`` (a switch)."""

    def __init__(self, option_strings: Sequence[str], dest: str, many: bool = False,
                 **kwds: Any) -> None:
        super().__init__(option_strings, dest, **kwds)
        self.many = many

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if self.many:
            setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), values])
            return
        value = self.const if self.nargs == 0 else values
        given = vars(namespace).setdefault(_GIVEN, {})
        if self.dest in given:
            shown = (None, None) if self.nargs == 0 else (given[self.dest], value)
            raise _Repeated("/".join(self.option_strings), *shown)
        given[self.dest] = value
        setattr(namespace, self.dest, value)


def option(*names: str, flag: bool = False, many: bool = False,
           **kwds: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """An option of a magic, as IPython's ``argument`` declares one, that may be given once:
    ``flag`` takes no value (``True`` when given), ``many`` may be given again (a list)."""
    if flag:
        kwds.update(nargs=0, const=True, default=False)
    return argument(*names, action=_Once, many=many, **kwds)


def without_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` that starts a word, outside quotes),
    as Python and the shell read one."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Each option string of ``parser`` (``-np``, ``--np``) and its action."""
    return parser._option_string_actions  # noqa: SLF001 - argparse has no public table of them


def line_words(parser: argparse.ArgumentParser, line: str, name: str) -> list[str]:
    """``line`` split as a shell splits it, without its comment, and each ``key=value`` word
    that names an option of ``parser`` (``np=4``, ``start_timeout=30``, ``checkpoint_dir=X``;
    not the value of an option before it: ``--env A=1``) as ``--key value``."""
    try:
        words = shlex.split(without_comment(line))
    except ValueError as exc:
        raise UsageError(f"{name}: cannot read the line ({exc}). Fix: close the quote, or put "
                         "the value in the other kind of quotes (--env 'MSG=say \"hi\"')"
                         ) from None
    table = _options(parser)
    keys: dict[str, str] = {}
    for string, action in table.items():
        if string.startswith("--") and action.nargs != 0:
            for key in (string[2:], string[2:].replace("-", "_"), action.dest):
                keys.setdefault(key, string)
    out: list[str] = []
    for word in words:
        match = _KEY_VALUE.match(word)
        before = table.get(out[-1]) if out else None
        if match and match.group(1) in keys and (before is None or before.nargs is not None):
            out += [keys[match.group(1)], match.group(2)]
        else:
            out.append(word)
    return out


def parse_line(magic: Callable[..., Any], line: str, name: str) -> argparse.Namespace:
    """The arguments of ``magic`` (declared with ``@magic_arguments``) on ``line``; ``name`` is
    the magic as typed (``%%horovod``, ``%hvd_pool``), which begins every error.

    Raises
    ------
    UsageError
        One line: a quote left open, an option given twice, one that is not the magic's, or
        argparse's own complaint (an option without its value), each with the fix.
    """
    parser = magic.parser  # type: ignore[attr-defined]  # set by @magic_arguments
    words = line_words(parser, line, name)
    try:
        args, unknown = parser.parse_known_args(words)
    except _Repeated as exc:
        raise UsageError(f"{name}: {exc}. Fix: give it once") from None
    except UsageError as exc:  # argparse's own words name the option and what is wrong
        raise UsageError(f"{name}: {exc}. Fix: {name}? shows each option and the value it "
                         "takes") from None
    if unknown:
        word = unknown[0].split("=", 1)[0] if unknown[0].startswith("-") else repr(unknown[0])
        raise UsageError(f"{name}: {word} is not one of its options. Fix: {name}? lists them "
                         "(a setting of your own code goes in the cell)")
    vars(args).pop(_GIVEN, None)
    return args


def parse_env(pairs: list[str] | None, name: str) -> dict[str, str]:
    """``--env`` values (``["K=V", ...]``) as a dict; ``UsageError`` for a pair without ``=``
    and for a variable given twice."""
    env: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"{name}: --env takes NAME=VALUE, got {pair!r}. "
                             f"Fix: --env {key or 'NAME'}=VALUE")
        if key in env:
            raise UsageError(f"{name}: --env {key} is given twice ({env[key]!r}, then "
                             f"{value!r}). Fix: give it once")
        env[key] = value
    return env
