"""What a command-line flag is, and how ``--help`` shows it.

A :class:`Flag` is named like the config field it sets and may also come from the
environment (``BERTSERVE_<FLAG>``). ``--help`` shows a command's flags under headings
(:data:`GROUPS`), a yes-or-no flag as ``--cpu, --no-cpu``, a flag of a fixed set of values
with its choices (taken in any case), and leaves the rarely used ones to ``--help-all``.
The flags themselves are in :mod:`.flags`.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bertserve.client.cli import unset_help

from ..errors import BertServeError

#: The ``--help`` headings, in the order shown; a command shows those its flags are under.
GROUPS = (
    "the head",
    "model",
    "serving",
    "limits and overload",
    "workers and devices",
    "HTTP and gRPC",
    "security",
    "several models and model versions",
    "health checks",
    "logs and traces",
)

#: What ``--help`` calls a flag's value, by how the flag's name ends (``--http-port PORT``).
_METAVARS = {
    "-ms": "MS",
    "-s": "SECONDS",
    "-bytes": "BYTES",
    "-bytes-total": "BYTES",
    "port": "PORT",
    "port-out": "PORT",
    "-dir": "DIR",
    "bind": "ADDR",
    "-name": "NAME",
}


def boolean(value: str | bool) -> bool:
    """A yes-or-no flag's value: true, yes, on or 1, or false, no, off or 0."""
    if isinstance(value, bool):
        return value
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {value!r}")


class _Switch(argparse.BooleanOptionalAction):
    """``--cpu`` and ``--no-cpu``; ``--cpu false`` (any word :func:`boolean` takes) works
    too, as in the environment. Left out, the flag keeps its default, which may be None:
    "what the model says"."""

    def __init__(self, option_strings: Sequence[str], dest: str, **options: Any) -> None:
        negated = [f"--no-{option[2:]}" for option in option_strings]
        argparse.Action.__init__(self, [*option_strings, *negated], dest, nargs="?", type=boolean, **options)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        negated = bool(option_string and option_string.startswith("--no-"))
        if negated and values is not None:
            raise argparse.ArgumentError(self, f"{option_string} takes no value")
        setattr(namespace, self.dest, not negated if values is None else values)


class _HelpAll(argparse.Action):
    """``--help-all``: the help, with the flags ``--help`` leaves out."""

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        hidden: Sequence[tuple[argparse.Action, str]] = (),
        epilog: str = "",
        **options: Any,
    ) -> None:
        super().__init__(option_strings, argparse.SUPPRESS, nargs=0, default=argparse.SUPPRESS, **options)
        self.hidden, self.epilog = list(hidden), epilog

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        for action, help in self.hidden:
            action.help = help
        parser.epilog = self.epilog
        parser.print_help()
        parser.exit()


@dataclass(frozen=True)
class Flag:
    """One command-line flag, named like the config field it sets (``--max-seq-len``:
    ``max_seq_len``), which ``BERTSERVE_MAX_SEQ_LEN`` can also set. ``unset`` says what
    leaving out a flag whose default is None (or empty) means, for ``--help``; ``group`` is
    its heading there (one of :data:`GROUPS`), and a ``rare`` flag is shown by
    ``--help-all`` only. A flag of kind :func:`boolean` is a switch: ``--xla``, ``--no-xla``."""

    name: str
    help: str
    kind: Callable[[str], Any] = str
    default: Any = None
    many: bool = False  # takes several values: --pooling-layer -1 -2
    unset: str = ""
    field: str = ""  # the config field it sets, when not the one named like it (--model: models)
    env_commas: bool = True  # several values in BERTSERVE_<FLAG> may be separated by commas, not only spaces
    choices: tuple[str, ...] = ()  # every value it takes, as its kind spells them; taken in any case
    metavar: str = ""  # what --help calls its value, when the name's ending does not say (see _METAVARS)
    group: str = ""
    rare: bool = False

    @property
    def dest(self) -> str:
        return self.field or self.name[2:].replace("-", "_")

    @property
    def env(self) -> str:
        return "BERTSERVE_" + self.name[2:].replace("-", "_").upper()

    @property
    def switch(self) -> bool:
        return self.kind is boolean

    def add_to(self, group: Any) -> argparse.Action:
        raw = os.environ.get(self.env)
        default = self.default if raw is None else self.parse_env(raw)
        help = unset_help(self.help, default, self.unset) if self.unset else self.help
        options: dict[str, Any] = {"default": default, "help": help}
        if self.switch:
            return group.add_argument(self.name, action=_Switch, **options)
        options.update(type=self._parser(), choices=self.choices or None, metavar=self._metavar())
        if self.field:  # --model fills models, and is still shown as --model MODEL
            options["dest"] = self.field
        if self.many:
            options["nargs"] = "+"
            if isinstance(self.default, tuple) and not self.default:  # repeatable: --prompt a=x --prompt b=y
                options.update(action="extend", default=list(default or ()))
        return group.add_argument(self.name, **options)

    def _metavar(self) -> str | None:
        if self.metavar or self.choices:
            return self.metavar or None  # argparse shows the choices: --dtype {auto,fp32,...}
        if self.field:
            return self.env.removeprefix("BERTSERVE_")
        ending = next((ending for ending in _METAVARS if self.name.endswith(ending)), None)
        if ending is not None:
            return _METAVARS[ending]
        return "N" if self.kind in (int, float) else None

    def parse_env(self, raw: str) -> Any:
        parse = self._parser()
        try:
            if self.many:
                values = [parse(item) for item in (raw.replace(",", " ") if self.env_commas else raw).split()]
            else:
                values = [parse(raw)]
        except (ValueError, argparse.ArgumentTypeError) as exc:
            raise BertServeError(f"{self.env}={raw!r}: {exc}") from None
        if self.choices and any(value not in self.choices for value in values):
            raise BertServeError(f"{self.env}={raw!r}: choose one of {', '.join(self.choices)}")
        return values if self.many else values[0]

    def _parser(self) -> Callable[[str], Any]:
        """The flag's kind; for a flag of choices, one that also takes a choice in any case
        (``--feed THREAD``: ``thread``)."""
        if not self.choices:
            return self.kind
        kind, choices = self.kind, {choice.casefold(): choice for choice in self.choices}

        def parse(text: str) -> Any:
            value = kind(text)
            return choices.get(str(value).casefold(), value) if isinstance(value, str) else value

        parse.__name__ = getattr(kind, "__name__", "value")  # argparse's "invalid int value: 'x'"
        return parse


def under(group: str, *flags: Flag) -> list[Flag]:
    """``flags``, shown under the ``--help`` heading ``group``."""
    return [dataclasses.replace(flag, group=group) for flag in flags]


def add_flags(parser: argparse.ArgumentParser, flags: Sequence[Flag], docs: str) -> None:
    """``flags`` on ``parser``, each under its heading. ``--help`` leaves the rare ones to
    ``--help-all``, and ends by saying how many it left out and where ``docs`` has them all."""
    groups = {title: parser.add_argument_group(title) for title in GROUPS if any(f.group == title for f in flags)}
    hidden = []
    for flag in flags:
        action = flag.add_to(groups[flag.group])
        if flag.rare:
            hidden.append((action, str(action.help)))
            action.help = argparse.SUPPRESS
    every = f"Every flag is described in {docs}."
    if not hidden:
        parser.epilog = every
        return
    parser.epilog = f"{len(hidden)} more flags: {parser.prog} --help-all. {every}"
    parser.add_argument("--help-all", action=_HelpAll, hidden=hidden, epilog=every, help="show every flag")


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args(argv)``, but a flag no command takes is reported by the command it
    was given to, with its usage line and the flag it most likely meant
    (``bertserve start: error: unrecognized arguments: --prot 17000; did you mean --port?``),
    where argparse reports it at the top level with no suggestion."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        command = _subcommands(parser).get(getattr(args, "command", None) or "", parser)
        flags = [flag for action in command._actions for flag in action.option_strings]
        message = f"unrecognized arguments: {' '.join(extras)}"
        guess = next((m for extra in extras if extra.startswith("-") and (m := closest(extra, flags))), None)
        if guess:
            message += f"; did you mean {guess}?"
        command.error(message)
    return args


def closest(typed: str, flags: Sequence[str]) -> str | None:
    """The flag ``typed`` (``--prot``, ``--max-seq-length=128``) most likely meant: the fewest
    edits, a swap of two neighbours counting as one, and at most a third of its letters."""
    word = typed.split("=", 1)[0]
    best = min(
        flags, key=lambda flag: (_edits(word, flag), -difflib.SequenceMatcher(None, word, flag).ratio()), default=None
    )
    return best if best is not None and _edits(word, best) <= max(1, len(word.lstrip("-")) // 3) else None


def _edits(a: str, b: str) -> int:
    """Optimal string alignment distance: insertions, deletions, substitutions and swaps."""
    rows = [list(range(len(b) + 1))]
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(rows[i - 1][j] + 1, row[j - 1] + 1, rows[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], rows[i - 2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}
