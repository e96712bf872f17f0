"""``AsyncBertClient``: the client for asyncio programs, any number of requests in flight at once.

    async with AsyncBertClient("localhost", 5555, timeout=10_000) as client:
        vectors = await client.encode(["First do it", "then do it right"])

One client serves every task of its event loop: each ``encode`` is a request of its own, over the one
pair of sockets of an :class:`~bertserve.client.aio.transport.AsyncTransport`, whose reader hands each
reply to the call waiting for it, with at most as many requests unanswered as the server queues replies
(the rest wait their turn in the client). Its options, handshake, requests and the matching of replies
are the client core's (:mod:`~bertserve.client.core`), shared with ``BertClient``, and so is the plan
of each call (:mod:`~bertserve.client.core.steps`): it checks and raises as ``BertClient`` does; only
the waiting is its own, on the loop. A call that is cancelled, or whose timeout runs out, withdraws its
request from the server (CANCEL).
"""

from __future__ import annotations

import asyncio
import warnings
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from ..core.api import BaseClient
from ..core.chunking import ASYNC_WINDOW, Gathered, chunks
from ..core.keywords import (
    EncodeKeywords,
    MultivectorOptions,
    OutputsOptions,
    PredictOptions,
    RerankOptions,
    SparseOptions,
)
from ..core.options import EncodeOptions, check_model, model_field
from ..core.results import Embedding, EncodeResult, answer, encode_result
from ..core.steps import Call, Chunks, Config, Plan, Step, Warn
from ..errors import ServerError
from ..protocol import ENCODE, RELOAD, STATUS, TERMINATE
from ..tasks import Prediction, Ranked, SparseVector
from ..terminal import progress_bar
from .connection import AsyncConnection

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; only type checkers read it

T = TypeVar("T")


class AsyncBertClient(BaseClient):
    """A connection to one bertserve server for the tasks of one asyncio event loop.

    The options are ``BertClient``'s: ``port_out`` (by default ``port + 1``), ``timeout``
    (milliseconds that each call waits for its answer, finite), ``output_fmt``, ``identity``,
    ``check_version``, ``check_length``, ``show_server_config``, ``server_key`` with
    ``client_cert`` for a server that uses CURVE, and ``model``, the served model every request
    goes to (``None``: the server's default); they are checked here, before any socket is opened.

    ``async with AsyncBertClient(...) as client`` (or ``await client.connect()``) opens the
    sockets and asks for the server's configuration, so a server that is not there raises
    :class:`NoServerError`: within a second if nothing listens on this machine, else within
    the timeout. A call on a client not yet connected connects first. A connection that fails
    leaves the client unconnected, and the next call tries again. The client belongs to the
    event loop it connected on. :meth:`aclose` (or :meth:`close`) fails the calls in flight
    with :class:`ClientClosedError`; a closed client raises it too, and closing it again does
    nothing.
    """

    def _open(self) -> None:
        self._connection = AsyncConnection(self._core)

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._connection.closed

    async def connect(self) -> None:
        """Open the sockets and ask for the server's configuration, if not done yet.

        Raises :class:`NoServerError` if no server answers (within a second if nothing listens
        on this machine, else within the timeout), :class:`WrongPortError` if something else
        answers at the port (the server's HTTP port, say), :class:`AuthenticationError` if the
        CURVE handshake is refused, and :class:`ProtocolVersionError` if the server speaks
        another protocol; the client is then left unconnected.
        """
        await self._connection.open()

    def close(self) -> None:
        """Fail the calls in flight with :class:`ClientClosedError` and close the sockets;
        calling it again does nothing. Call it from the client's event loop (or once that
        loop has stopped); :meth:`aclose` also waits for the reader to end."""
        self._connection.close()

    async def aclose(self) -> None:
        """:meth:`close`, then wait for the reader task to end."""
        self.close()
        await self._connection.wait_closed()

    async def __aenter__(self) -> AsyncBertClient:
        await self._connection.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return (
            f"<AsyncBertClient {self._address} out={self.port_out} id={self.identity!r} {self._connection.state.value}>"
        )

    # -- control commands --------------------------------------------------------------

    async def server_config(self) -> dict[str, Any]:
        """The server's configuration of this client's model, asked for afresh, as
        ``BertClient.server_config``."""
        return await self.server_config_of(self.model)

    async def server_config_of(self, model: str | None) -> dict[str, Any]:
        """The server's configuration of ``model`` (``None``: its default model), asked for
        afresh; :class:`UnknownModelError` if the server does not serve it."""
        model = check_model(model)
        return dict(await self._connection.ask_config(model))

    async def server_status(self) -> dict[str, Any]:
        """The server's current status (workers, queues, counters; each model's in ``models``)."""
        return await self._call(STATUS, "STATUS")

    async def terminate(self) -> dict[str, Any]:
        """Ask the server to shut down; its answer (``{"stopping": true}``)."""
        return await self._call(TERMINATE, "TERMINATE")

    async def reload(self, version: int | str = "latest", *, model: str | None = None) -> dict[str, Any]:
        """Ask a server of a model repository to swap ``model`` (``None``: this client's) to
        ``version``, as ``BertClient.reload``."""
        header = {"version": str(version), **model_field(check_model(model) or self.model)}
        return await self._call(RELOAD, "RELOAD", header)

    # -- encoding ----------------------------------------------------------------------

    async def encode(
        self,
        texts: Sequence[Any],
        *,
        show_tokens: bool = False,
        show_progress: bool = False,
        **options: Unpack[EncodeKeywords],
    ) -> Embedding | tuple[Embedding, list[list[str]]]:
        """Encode ``texts`` into one vector each, as ``BertClient.encode`` does (``blocking``
        aside: the caller awaits the answer, and other tasks run meanwhile).

        Returns the ``(len(texts), D)`` vectors, or ``(vectors, tokens)`` with ``show_tokens``.
        Bad texts or options raise ``ValueError``/``TypeError`` before anything is sent. With
        ``show_progress`` an input larger than one chunk goes as one request per chunk, four in
        flight, counted on a tqdm bar. The options (``is_tokenized``, ``pairs``, ``long_inputs``,
        ``dimensions``, ``prompt_name``, ``truncation_direction``, ``normalize``, ``model`` and
        ``output``) are ``BertClient.encode``'s, described in :mod:`~bertserve.client.core.keywords`;
        the request's are sent with every chunk.

        Raises :class:`ServerTimeoutError` when no answer comes within ``timeout`` ms (each
        chunk's answer), :class:`ServerError` (:class:`ServerBusyError` for a refusal of kind
        busy) when the server answers with an error, and :class:`ClientClosedError` if the
        client is closed meanwhile. Cancelling the call withdraws its request from the server.
        """
        plan = self._core.encode(texts, options, show_tokens=show_tokens, show_progress=show_progress)
        return await self._run(plan)

    # -- tasks beside embedding ------------------------------------------------------------

    async def rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_n: int | None = None,
        **options: Unpack[RerankOptions],
    ) -> list[Ranked]:
        """``BertClient.rerank``, awaited: ``documents`` ranked by their relevance to ``query``."""
        return await self._run(self._core.rerank(query, documents, top_n, options))

    async def predict(
        self, inputs: Sequence[str | tuple[str, str]], **options: Unpack[PredictOptions]
    ) -> list[list[Prediction]]:
        """``BertClient.predict``, awaited: each input's labels, best first, with their scores."""
        return await self._run(self._core.predict(inputs, options))

    async def encode_sparse(self, texts: Sequence[str], **options: Unpack[SparseOptions]) -> list[SparseVector]:
        """``BertClient.encode_sparse``, awaited: each text's non-zero SPLADE weights."""
        return await self._run(self._core.encode_sparse(texts, options))

    async def encode_multivector(self, texts: Sequence[str], **options: Unpack[MultivectorOptions]) -> list[np.ndarray]:
        """``BertClient.encode_multivector``, awaited: each text's token vectors."""
        return await self._run(self._core.encode_multivector(texts, options))

    async def encode_outputs(self, texts: Sequence[str], **options: Unpack[OutputsOptions]) -> list[dict[str, Any]]:
        """``BertClient.encode_outputs``, awaited: several outputs of each text from one model run."""
        return await self._run(self._core.encode_outputs(texts, options))

    # -- internals ---------------------------------------------------------------------

    async def _run(self, call: Call[T]) -> T:
        """The answer of ``call``, planned by the core, each of its steps awaited in turn."""
        plan = Plan(call)
        for step in plan:
            plan.answer(await self._step(step))
        return plan.result

    async def _step(self, step: Step) -> Any:
        """What ``step`` of a call comes to, each answer awaited at most ``timeout`` ms."""
        if isinstance(step, Config):
            await self._connection.open()
            return await self._connection.config_of(step.model)
        if isinstance(step, Warn):
            warnings.warn(step.message, stacklevel=4)  # past _step, _run and the client's method: its caller
            return None
        if isinstance(step, Chunks):
            return await self._encode_chunks(step.texts, step.options, step.size, progress=step.progress)
        return await self._encode(step.texts, step.options, step.output_fmt)

    async def _call(self, command: bytes, what: str, header: dict[str, Any] | None = None) -> dict[str, Any]:
        return answer(await self._connection.request(command, what, header))

    async def _encode(
        self, texts: list[Any], options: EncodeOptions, output_fmt: Literal["ndarray", "list"]
    ) -> EncodeResult:
        reply = await self._connection.request(ENCODE, "request", options.header(self._core.timeout), texts)
        return encode_result(reply, options.show_tokens, output_fmt)

    async def _encode_chunks(
        self, texts: list[Any], options: EncodeOptions, size: int, *, progress: bool = True
    ) -> tuple[np.ndarray, list[list[str]]]:
        """``texts`` as one request per chunk of ``size``, ``ASYNC_WINDOW`` in flight, joined as
        the server joins the parts of one request; with ``progress`` a tqdm bar counts the texts answered."""
        parts = chunks(texts, size)
        in_flight: deque[asyncio.Task[EncodeResult]] = deque()
        gathered = Gathered()
        try:
            with progress_bar(len(texts), disable=not progress) as bar:
                while True:
                    while len(in_flight) < ASYNC_WINDOW and (part := next(parts, None)) is not None:
                        in_flight.append(asyncio.ensure_future(self._encode(part, options, "ndarray")))
                    if not in_flight:
                        break
                    bar.update(gathered.add(await in_flight.popleft()))
        except ServerError as exc:  # about the chunk from texts[done] on
            raise gathered.renumbered(exc) from None
        finally:
            for task in in_flight:
                task.cancel()  # each withdraws its request
            if in_flight:
                await asyncio.wait(in_flight)
        return gathered.joined()
