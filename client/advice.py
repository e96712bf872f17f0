"""How a message tells its reader what to change: as the Python API's keyword arguments, or
as the flags of a command.

A message that ends in advice (a long input that will be cut, a server that is not there)
is built with an :class:`Advice`. The clients use :data:`PYTHON`; ``bertserve encode``
passes its own, so that a person at the shell reads flags they can type. Errors that carry
such a message keep what it is made of, and say it again for another reader
(:meth:`~bertserve.client.errors.NoServerError.advise`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Advice:
    """The words of advice for one kind of reader.

    ``chunk``, ``silence_length`` and ``silence_version`` complete "... to encode it in
    windows", "... to silence this" (``None``: there is no way to, so say nothing);
    ``max_seq_len`` names the server's option; ``server_elsewhere`` says how to reach a
    server on another host or port. ``input`` is what one input is called, and
    ``line_numbers`` (if given) the number of each input, else its index names it.
    ``flags`` says whether the reader names the client's options as a command's flags
    (``--port-out``) or as keyword arguments (``port_out``); ``None``: as ``max_seq_len`` does.
    """

    chunk: str
    silence_length: str | None
    silence_version: str | None
    max_seq_len: str
    server_elsewhere: str
    input: str = "text"
    line_numbers: Sequence[int] | None = None
    flags: bool | None = None

    def option(self, name: str) -> str:
        """The client's option ``name`` (``port_out``), as the reader names it (``--port-out``)."""
        flags = self.max_seq_len.startswith("--") if self.flags is None else self.flags
        return f"--{name.replace('_', '-')}" if flags else name

    def name(self, index: int) -> str:
        """How the message names the input at ``index``: ``texts[3]``, or ``line 4``."""
        if self.line_numbers is None:
            return f"texts[{index}]"
        return f"line {self.line_numbers[index]}"


PYTHON = Advice(
    chunk="pass long_inputs='chunk'",
    silence_length="pass check_length=False",
    silence_version="pass check_version=False",
    max_seq_len="max_seq_len",
    server_elsewhere="pass its host= and port=",
)
"""The advice a program using the Python API reads."""
