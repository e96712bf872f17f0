"""A client call as a sans-IO plan: a generator that yields what it needs of the server, one
step at a time, and returns the call's answer.

:class:`~bertserve.client.core.base.ClientCore` writes each call of the client API (``encode``,
``rerank``, ``predict``, ``encode_sparse``) once, as such a generator; the drivers step through
it with :class:`Plan`, doing what each step asks on their own sockets and in their own way of
waiting (a thread's, an event loop's), and hand its answer back:

    plan = Plan(core.rerank(query, documents, ...))
    for step in plan:
        plan.answer(do(step))  # or: await do(step)
    return plan.result

A step that fails raises from the driver, and the call ends there.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeAlias, TypeVar

from .options import EncodeOptions

T = TypeVar("T")


@dataclass(frozen=True)
class Config:
    """Wants the configuration of ``model`` (``None``: the server's default): as last told, or
    asked for the first time a request goes to it."""

    model: str | None


@dataclass(frozen=True)
class Warn:
    """Wants ``message`` warned of, to the caller of the client's method."""

    message: str


@dataclass(frozen=True)
class Encode:
    """Wants one ENCODE request of ``texts`` with ``options`` sent and its
    :class:`~bertserve.client.core.results.EncodeResult`, in ``output_fmt``, awaited; with
    ``fetchable`` (``blocking=False``) only its request id, its answer left to ``fetch``."""

    texts: list[Any]
    options: EncodeOptions
    output_fmt: Literal["ndarray", "list"]
    fetchable: bool = False


@dataclass(frozen=True)
class Chunks:
    """Wants ``texts`` sent as consecutive requests of ``size`` texts, a window of them in
    flight, and their answers joined as the server joins the parts of one request (the
    vectors and the tokens: :func:`~bertserve.client.core.chunking.gather`); with
    ``progress``, a bar counts the texts answered."""

    texts: list[Any]
    options: EncodeOptions
    size: int
    progress: bool


Step: TypeAlias = "Config | Warn | Encode | Chunks"
Call: TypeAlias = Generator[Step, Any, T]
"""A call's plan: yields steps, is sent each step's answer, returns the call's answer."""


class Plan(Generic[T]):
    """A driver's way through ``call``: iterate its steps, :meth:`answer` each, then read
    :attr:`result`."""

    def __init__(self, call: Call[T]) -> None:
        self._call = call
        self._answer: Any = None
        self.result: T

    def __iter__(self) -> Iterator[Step]:
        while True:
            try:
                step = self._call.send(self._answer)
            except StopIteration as done:
                self.result = done.value
                return
            self._answer = None
            yield step

    def answer(self, value: Any) -> None:
        """What the step just yielded came to: the call goes on with it."""
        self._answer = value
