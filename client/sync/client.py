"""``BertClient``: sentences in, vectors out, from a bertserve server over ZeroMQ.

This module is the client's API: it holds the caller to one thread, runs each call through
the client core (:mod:`~bertserve.client.core`: options, handshake, request framing, reply
matching, written once for this client and ``AsyncBertClient``), and translates low-level
errors at its boundary. Each method asks the core for the plan of its call
(:mod:`~bertserve.client.core.steps`) and does its steps (:meth:`BertClient._step`): the
options, the requests and the answer are the core's. The waits are the sync driver's
(:class:`~bertserve.client.sync.connection.Connection` over a
:class:`~bertserve.client.sync.transport.Transport`), and the windows of requests behind
``encode_async`` and ``encode(show_progress=True)`` are :mod:`~bertserve.client.core.chunking`'s.

Every wait has a deadline (the ZeroMQ guide's Lazy Pirate client), so a server that is down
or gone gives :class:`ServerTimeoutError` within ``timeout`` milliseconds instead of a hang.
With ``server_key`` and ``client_cert`` both sockets use CURVE, and the client's identity is
its public key, ``":"`` and a suffix, the only form a CURVE server lets it use; a refused
handshake raises :class:`AuthenticationError` rather than a timeout.

Over 400 lines: this is the sync client's public API, and most of it is the documentation of
that API (each method's docstring) and the five typing overloads of ``encode``; what the calls
share with ``AsyncBertClient`` is in the core already.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import threading
import warnings
from collections.abc import Collection, Generator, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import numpy as np
import zmq

from ..core.api import BaseClient
from ..core.chunking import checked, chunks, concatenated, gather, in_order
from ..core.keywords import (
    EncodeKeywords,
    MultivectorOptions,
    OutputsOptions,
    PredictOptions,
    RequestOptions,
    RerankOptions,
    SparseOptions,
)
from ..core.options import EncodeOptions, check_model, model_field
from ..core.requests import length_warning
from ..core.results import Embedding, EncodeResult
from ..core.steps import Call, Chunks, Config, Plan, Step, Warn
from ..errors import ClientClosedError, ConcurrentUseError, ProtocolVersionError
from ..protocol import RELOAD, STATUS, TERMINATE, ProtocolError
from ..tasks import Prediction, Ranked, SparseVector
from .connection import Connection

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11; only type checkers read it

logger = logging.getLogger("bertserve.client")

T = TypeVar("T")

_CONCURRENT_USE = (
    "this BertClient is in use by another thread; use ConcurrentBertClient to share one server between threads"
)


class BertClient(BaseClient):
    """A connection to one bertserve server; not to be shared between threads.

    ``BertClient(host, port, port_out)`` connects to the server's request port ``port`` and
    reply port ``port_out`` (by default ``port + 1``, as the server has it) and asks for its
    configuration, so a server that is not there raises :class:`NoServerError` (a
    :class:`ServerTimeoutError`): within a second if nothing listens on this machine, else
    once the timeout runs out. A port where something else answers (the server's HTTP port or
    its reply port, say) raises :class:`WrongPortError`, naming it, within a second or two.
    ``timeout`` (milliseconds, finite) bounds every wait. Use it as a context manager, or call
    :meth:`close`; a closed client raises :class:`ClientClosedError`.
    Calls from two threads at once raise :class:`ConcurrentUseError`: share a server between
    threads with ``ConcurrentBertClient``.

    Options: ``output_fmt`` ``"ndarray"`` (default) or ``"list"``; ``identity`` the bytes
    the replies are addressed to (default a random UUID); ``check_version`` compares the
    server's version and protocol with this client's; ``check_length`` warns when a text
    has more words than the server's ``max_seq_len``; ``show_server_config`` logs the
    server's configuration on connecting.

    ``model`` is the served model every request goes to (``None``: the server's default;
    ``encode(model=...)`` picks another for one call); one the server does not serve raises
    :class:`UnknownModelError`. A request's options are checked against its model's config.

    Against a server that uses CURVE pass both ``server_key`` (the server's ``server.key``
    file or its z85 public key) and ``client_cert`` (this client's ``NAME.key_secret``, whose
    public half the server lists). The identity then becomes ``public_key + b":" + identity``
    (at most 64 bytes; by default a random suffix). A server that refuses the key, or a
    mismatch between a CURVE and a plain side, raises :class:`AuthenticationError`.
    """

    def _open(self) -> None:
        self._lock = threading.Lock()
        self._closed = False
        #: What the last reply said beside its vectors: ``token_count`` (the tokens its inputs
        #: became, [CLS] and [SEP] included), ``chunked`` (inputs encoded in windows), ``truncated``
        #: (the indexes of the inputs cut to the model's length: after :meth:`rerank`, the pairs
        #: cut, by their documents' index) and, from a server of a model repository,
        #: ``model_version``; from a server of several models, ``model``.
        self.last_info: dict[str, Any] = {}
        self._connection = self._connect()
        if self.check_version:
            try:
                self._core.check_server(stacklevel=3)  # past _open and __init__: their caller
            except ProtocolVersionError:
                self.close()
                raise
        if self.show_server_config:
            logger.info("server config of %s:\n%s", self._address, json.dumps(self._core.config, indent=2))

    def _connect(self) -> Connection:
        """The connection to the server, its handshake done; the client is closed if it fails."""
        try:
            connection = Connection(self._core)
        except zmq.ZMQError as exc:
            self._closed = True
            raise self._core.cannot_connect(exc) from exc
        try:
            with self._using():
                connection.handshake()
        except BaseException:
            self._closed = True
            connection.destroy()
            raise
        return connection

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Close the sockets and discard queued messages; calling it again does nothing."""
        if self._closed:
            return
        if not self._lock.acquire(blocking=False):
            raise ConcurrentUseError(_CONCURRENT_USE)
        try:
            self._closed = True
            self._connection.close()
        finally:
            self._lock.release()

    def __enter__(self) -> BertClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<BertClient {self._address} out={self.port_out} id={self.identity!r} {state}>"

    # -- control commands --------------------------------------------------------------

    @property
    def server_config(self) -> dict[str, Any]:
        """The server's configuration of this client's model, asked for afresh; from a server of
        several models with ``model_name``, ``default_model`` and every model it serves (``models``)."""
        return self.server_config_of(self.model)

    def server_config_of(self, model: str | None) -> dict[str, Any]:
        """The server's configuration of ``model`` (``None``: its default model), asked for
        afresh; :class:`UnknownModelError` if the server does not serve it."""
        model = check_model(model)
        with self._using():
            return dict(self._connection.ask_config(model))

    @property
    def server_status(self) -> dict[str, Any]:
        """The server's current status (workers, queues, counters; each model's in ``models``)."""
        with self._using():
            return self._connection.call(STATUS, "STATUS")

    def terminate(self) -> dict[str, Any]:
        """Ask the server to shut down; returns its answer (``{"stopping": true}``)."""
        with self._using():
            return self._connection.call(TERMINATE, "TERMINATE")

    def reload(self, version: int | str = "latest", *, model: str | None = None) -> dict[str, Any]:
        """Ask a server of a model repository to check it now and swap to ``version`` (a
        number, or ``"latest"``: the newest whole version above the one served). Answered at
        once with ``{"reload": n, ...}``; the swap's progress is ``server_status["swap"]``,
        which names the reload ``n`` it answers. Same permissions as :meth:`terminate`.
        ``model`` is the served model to reload (``None``: this client's)."""
        header = {"version": str(version), **model_field(check_model(model) or self.model)}
        with self._using():
            return self._connection.call(RELOAD, "RELOAD", header)

    # -- encoding ----------------------------------------------------------------------

    @overload
    def encode(
        self,
        texts: Sequence[Any],
        *,
        blocking: Literal[True] = ...,
        show_tokens: Literal[False] = ...,
        show_progress: bool = ...,
        **options: Unpack[EncodeKeywords],
    ) -> Embedding: ...

    @overload
    def encode(
        self,
        texts: Sequence[Any],
        *,
        blocking: Literal[True] = ...,
        show_tokens: Literal[True],
        show_progress: bool = ...,
        **options: Unpack[EncodeKeywords],
    ) -> tuple[Embedding, list[list[str]]]: ...

    @overload
    def encode(
        self,
        texts: Sequence[Any],
        *,
        blocking: Literal[False],
        show_tokens: bool = ...,
        show_progress: Literal[False] = ...,
        **options: Unpack[EncodeKeywords],
    ) -> int: ...

    @overload
    def encode(
        self,
        texts: Sequence[Any],
        *,
        blocking: Literal[True] = ...,
        show_tokens: bool,
        show_progress: bool = ...,
        **options: Unpack[EncodeKeywords],
    ) -> Embedding | tuple[Embedding, list[list[str]]]: ...

    @overload
    def encode(
        self,
        texts: Sequence[Any],
        *,
        blocking: bool = ...,
        show_tokens: bool = ...,
        show_progress: bool = ...,
        **options: Unpack[EncodeKeywords],
    ) -> Embedding | tuple[Embedding, list[list[str]]] | int: ...

    def encode(
        self,
        texts: Sequence[Any],
        *,
        blocking: bool = True,
        show_tokens: bool = False,
        show_progress: bool = False,
        **options: Unpack[EncodeKeywords],
    ) -> Embedding | tuple[Embedding, list[list[str]]] | int:
        """Encode ``texts`` into one vector each (or one per token, if the server pools none).

        ``texts`` is a list of non-empty strings (``"first ||| second"`` for a sentence pair;
        with ``pairs=False`` every text is one sentence, ``|||`` or not) or, with
        ``is_tokenized``, a list of token lists; a bad element raises ``ValueError`` before
        anything is sent. Returns the ``(len(texts), D)`` vectors, or ``(vectors, tokens)``
        with ``show_tokens``. With ``blocking=False`` it returns the request id at once;
        collect the answer with :meth:`fetch` or :meth:`fetch_all`.

        With ``show_progress`` an input larger than one chunk (four of the server's mini-jobs:
        ``4 * max_batch_size`` texts, 1024 with the default server) goes as one request per
        chunk, four in flight at once, while a tqdm bar on stderr counts the texts answered.
        The answer is the one a single request gets, in the same order; each chunk's answer is
        awaited at most ``timeout`` ms, so a long input needs no longer timeout. A smaller
        input is one request, with no bar.

        ``long_inputs`` (``"truncate"`` or ``"chunk"``), ``dimensions`` (keep the first k),
        ``prompt_name``, ``truncation_direction`` (``"right"`` or ``"left"``) and ``normalize``
        (``False``: a normalizing model's vectors before its Normalize module) are the
        request's options (see :class:`~bertserve.client.core.options.EncodeOptions`); each is
        sent only when given, and checked before anything is sent. :attr:`last_info` has the
        reply's ``token_count`` and ``chunked`` (how many inputs were encoded in windows).
        ``model`` sends this call to another of the server's models than the client's. The
        options of every method are listed in :mod:`~bertserve.client.core.keywords`; one it
        does not take raises ``TypeError``.

        ``output`` answers the vectors in a compact form, as sentence-transformers'
        ``quantize_embeddings`` makes it: ``"binary"`` or ``"ubinary"`` (sign bits, 8 to a byte,
        as int8 offset by -128 or as uint8), ``"int8"`` or ``"uint8"`` (256 steps of each
        dimension's range over the model's calibration set; ``bertserve calibrate`` makes one).

        Raises :class:`ServerTimeoutError` when no answer comes within the timeout and
        :class:`ServerError` when the server answers with an error.
        """
        plan = self._core.encode(
            texts, options, blocking=blocking, show_tokens=show_tokens, show_progress=show_progress
        )
        return self._run(plan)

    # -- tasks beside embedding ------------------------------------------------------------

    def rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_n: int | None = None,
        **options: Unpack[RerankOptions],
    ) -> list[Ranked]:
        """Rank ``documents`` by their relevance to ``query`` with a reranker (a cross-encoder
        the server serves): the documents best first, the first ``top_n`` (by default all),
        each with its index in ``documents`` and its score (the model's logit through its
        activation, as sentence-transformers' ``CrossEncoder.predict`` gives it; the logit
        with ``raw_scores``), and its text with ``return_documents``. One request, whose rows
        are the ``len(documents)`` pairs; a pair longer than the model takes is cut, the longer
        side first."""
        return self._run(self._core.rerank(query, documents, top_n, options))

    def predict(
        self, inputs: Sequence[str | tuple[str, str]], **options: Unpack[PredictOptions]
    ) -> list[list[Prediction]]:
        """Classify each of ``inputs`` (a text, or a ``(first, second)`` pair) with a classifier
        the server serves: each input's labels, best first, with their probabilities (a
        softmax over the labels; a sigmoid for a model of one label), or their logits with
        ``raw_scores``."""
        return self._run(self._core.predict(inputs, options))

    def encode_sparse(self, texts: Sequence[str], **options: Unpack[SparseOptions]) -> list[SparseVector]:
        """Each of ``texts`` as a sparse vector of a SPLADE model the server serves: its
        non-zero vocabulary weights (ids ascending), only the ``top_k`` largest if given."""
        return self._run(self._core.encode_sparse(texts, options))

    def encode_multivector(self, texts: Sequence[str], **options: Unpack[MultivectorOptions]) -> list[np.ndarray]:
        """Each of ``texts`` as its token vectors, by a late-interaction model the server serves
        (a ColBERT model, BGE-M3): one ``(tokens, dim)`` float32 array a text, each vector of
        unit length. ``is_query=True`` reads the texts as queries (ColBERT's query prefix and
        ``[MASK]`` expansion), else as documents. Score a query against a document with
        :func:`bertserve.client.late.maxsim`, or ask :meth:`rerank` to."""
        return self._run(self._core.encode_multivector(texts, options))

    def encode_outputs(self, texts: Sequence[str], **options: Unpack[OutputsOptions]) -> list[dict[str, Any]]:
        """Several outputs of each of ``texts`` by a late-interaction model (BGE-M3), from one
        model run of each: ``outputs`` names them (by default ``("embed", "sparse",
        "multivector")``), and each text's answer is a dict of them: ``embed`` its normalized
        vector, ``sparse`` a :class:`~bertserve.client.tasks.SparseVector`, ``multivector`` its
        ``(tokens, dim)`` float32 array."""
        return self._run(self._core.encode_outputs(texts, options))

    def fetch(self) -> Iterator[EncodeResult]:
        """Yield the answers to the outstanding ``blocking=False`` requests as they arrive.

        Each answer is awaited at most ``timeout`` ms; on a timeout the requests still
        outstanding are given up and :class:`ServerTimeoutError` is raised. An error answer
        raises :class:`ServerError` (its ``request_id`` says which); the other requests stay
        outstanding.
        """
        while True:
            with self._using():
                waiting = self._connection.fetchable()
                if not waiting:
                    return
                result = self._collect(waiting, self._connection.deadline(), f"{len(waiting)} outstanding request(s)")
            yield result

    @overload
    def fetch_all(self, sort: bool = ..., concat: Literal[False] = ...) -> list[Embedding]: ...

    @overload
    def fetch_all(self, sort: bool = ..., *, concat: Literal[True]) -> Embedding: ...

    def fetch_all(self, sort: bool = True, concat: bool = False) -> list[Embedding] | Embedding:
        """The vectors of every outstanding ``blocking=False`` request.

        A list with one entry per request, in request order with ``sort`` (else in order of
        arrival); with ``concat``, all rows in one array (or one list).
        """
        results = list(self.fetch())
        if sort:
            results.sort(key=lambda result: result.id)
        embeddings = [result.embedding for result in results]
        return concatenated(embeddings, self.output_fmt, self._core.config) if concat else embeddings

    def encode_async(
        self,
        batch_generator: Iterable[Sequence[Any]],
        *,
        max_num_batch: int | None = None,
        **options: Unpack[RequestOptions],
    ) -> Iterator[Embedding]:
        """Encode the batches ``batch_generator`` yields, keeping a few requests in flight.

        Yields each batch's vectors in the order of the batches; stops after
        ``max_num_batch`` batches if given. Each answer is awaited at most ``timeout`` ms.
        Every batch is sent with the request options, ``pairs`` too, as :meth:`encode` sends them.
        """
        if max_num_batch is not None and (isinstance(max_num_batch, bool) or max_num_batch < 0):
            raise ValueError(f"max_num_batch must be None or >= 0, not {max_num_batch!r}")
        return self._encode_batches(batch_generator, max_num_batch, self._core.encode_options("encode_async", options))

    def _encode_batches(
        self, batch_generator: Iterable[Sequence[Any]], max_num_batch: int | None, options: EncodeOptions
    ) -> Iterator[Embedding]:
        """:meth:`encode_async`'s vectors, its options read."""
        with self._using():
            config = self._connection.config_of(options.model)
        options.check_server(config)
        limit = functools.partial(length_warning, config) if self.check_length else None
        batches = checked(
            itertools.islice(batch_generator, max_num_batch), options.is_tokenized, limit, pairs=options.pairs
        )
        answers = self._in_order(batches, options)
        try:
            while True:
                with self._using():
                    result = next(answers, None)
                if result is None:
                    return
                yield result.embedding
        finally:
            answers.close()  # gives up the requests still in flight

    # -- internals ---------------------------------------------------------------------

    @contextmanager
    def _using(self) -> Iterator[None]:
        """Hold the client for one call: fail loudly if another thread holds it, and
        translate low-level errors at the boundary."""
        if not self._lock.acquire(blocking=False):
            raise ConcurrentUseError(_CONCURRENT_USE)
        try:
            if self._closed:
                raise ClientClosedError("this BertClient is closed")
            yield
        except ProtocolError as exc:
            raise self._core.malformed(exc) from exc
        except zmq.ZMQError as exc:
            raise self._core.zmq_failed(exc) from exc
        finally:
            self._lock.release()

    def _run(self, call: Call[T]) -> T:
        """The answer of ``call``, planned by the core, each of its steps done in turn while
        holding the client."""
        plan = Plan(call)
        with self._using():
            for step in plan:
                plan.answer(self._step(step))
        return plan.result

    def _step(self, step: Step) -> Any:
        """What ``step`` of a call comes to, each wait at most ``timeout`` ms."""
        connection = self._connection
        if isinstance(step, Config):
            return connection.config_of(step.model)
        if isinstance(step, Warn):
            warnings.warn(step.message, stacklevel=4)  # past _step, _run and the client's method: its caller
            return None
        if isinstance(step, Chunks):
            # One request per chunk, a bar counting the answers, joined as the server joins parts.
            answers = self._in_order(chunks(step.texts, step.size), step.options, "ndarray")
            return gather(answers, len(step.texts), progress=step.progress)
        deadline = connection.deadline()
        request_id = connection.send_encode(step.texts, deadline, step.options, fetchable=step.fetchable)
        if step.fetchable:
            return request_id
        try:
            return self._collect({request_id}, deadline, f"request {request_id}", step.output_fmt)
        except KeyboardInterrupt:  # the server drops what it has not computed yet
            connection.give_up({request_id})
            raise

    def _in_order(
        self, batches: Iterator[list[Any]], options: EncodeOptions, output_fmt: Literal["ndarray", "list"] | None = None
    ) -> Generator[EncodeResult, None, None]:
        """Send each of ``batches`` as one request with ``options``, a window of them in flight,
        and yield their answers in the order of the batches, each awaited at most ``timeout`` ms.

        Whoever advances this generator holds the client (``_using``). Closing it gives up the
        requests still in flight: their replies, if they come, are dropped.
        """
        connection = self._connection

        def send(batch: list[Any]) -> int:
            return connection.send_encode(batch, connection.deadline(), options, fetchable=False)

        def collect(request_id: int) -> EncodeResult:
            return self._collect({request_id}, connection.deadline(), f"request {request_id}", output_fmt)

        return in_order(batches, send, collect, connection.give_up)

    def _collect(
        self, wanted: Collection[int], deadline: float, what: str, output_fmt: Literal["ndarray", "list"] | None = None
    ) -> EncodeResult:
        """The first answer to one of ``wanted`` (in ``output_fmt``, by default the client's);
        its info becomes :attr:`last_info`."""
        result = self._connection.collect(wanted, deadline, what, output_fmt or self.output_fmt)
        self.last_info = result.info
        return result
