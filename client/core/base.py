"""What ``BertClient`` and ``AsyncBertClient`` share, with no sockets and no waiting.

A :class:`ClientCore` holds a client's checked options and its timeout, what the server told
of each model it asked about (a server of several models has a configuration for each: its
dimension, prompts, length), the frames of its requests, and the errors a wait ends with. The
drivers (``sync/``, ``aio/``) own the sockets and the waiting, and ask the core what to send,
what a reply means and which error to raise, as httpx's ``Client`` and ``AsyncClient`` ask
their ``BaseClient``.

Each call of the client API is planned here once (:meth:`ClientCore.encode`, :meth:`~ClientCore.rerank`,
...): its options checked, its texts cut into requests, its answer made of the replies, as a
sans-IO plan (:mod:`.steps`) that each driver steps through on its own sockets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .. import late, tasks as t
from ..errors import BertClientError, ServerTimeoutError
from ..protocol import CANCEL, Reply, check_texts
from ..tasks import Prediction, Ranked, SparseVector
from .handshake import Handshake, check_server
from .keywords import (
    ENCODE_DEFAULTS,
    MULTIVECTOR_DEFAULTS,
    OUTPUTS_DEFAULTS,
    PREDICT_DEFAULTS,
    RERANK_DEFAULTS,
    SPARSE_DEFAULTS,
    read_options,
)
from .options import ClientOptions, EncodeOptions, check_model, check_timeout
from .requests import check_size, encode_options, plan_encode, request_frames
from .results import in_format, shaped
from .steps import Call, Chunks, Config, Encode, Warn


class ClientCore:
    """The shared state of one client of the server ``options`` name."""

    def __init__(self, options: ClientOptions, client: str = "BertClient") -> None:
        self.options = options
        self.client = client  # the client's class, as its methods' errors name them
        self.address = options.address
        self._timeout = options.timeout
        self._configs: dict[str | None, dict[str, Any]] = {}  # by model name, None the server's default

    @property
    def timeout(self) -> float:
        """Milliseconds that any one wait may take; may be changed at any time."""
        return self._timeout

    @timeout.setter
    def timeout(self, timeout: float) -> None:
        self._timeout = check_timeout(timeout)

    # -- what the server told ----------------------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        """The configuration of the client's model, as the server last told it."""
        return self._configs.get(self.options.model, {})

    def known_config(self, model: str | None) -> dict[str, Any] | None:
        """The configuration of ``model`` (``None``: the server's default) as last told, if it
        was: a request's options are checked against the model it goes to."""
        return self._configs.get(model)

    def learn(self, model: str | None, config: dict[str, Any]) -> dict[str, Any]:
        """Keep ``config``, what the server said of ``model``; ``config``."""
        self._configs[model] = config
        return config

    # -- connecting --------------------------------------------------------------------

    def handshake(self, now: float) -> Handshake:
        """The handshake of a connection started ``now``, with the client's timeout."""
        return Handshake(
            self.options.model, address=self.address, port_out=self.options.port_out, timeout_ms=self._timeout, now=now
        )

    def connected(self, handshake: Handshake, reply: Reply) -> dict[str, Any]:
        """The configuration of the client's model that ``reply`` answers ``handshake`` with, kept."""
        return self.learn(self.options.model, handshake.config(reply))

    def check_server(self, *, stacklevel: int) -> None:
        """Raise :class:`ProtocolVersionError` if the server speaks another protocol; warn if it
        runs another version of bertserve, ``stacklevel`` as ``warnings.warn`` would take it
        where this is called."""
        check_server(self.config, self.address, stacklevel=stacklevel + 2)  # past check_server and this

    # -- requests ----------------------------------------------------------------------

    def frames(
        self, command: bytes, request_id: int, header: dict[str, Any] | None = None, texts: Sequence[Any] = ()
    ) -> list[bytes]:
        """The frames of a request; ``ValueError`` if the server would drop them unread."""
        frames = request_frames(self.options.identity, command, request_id, header, texts)
        check_size(frames, self.config)
        return frames

    def cancel_frames(self, request_id: int) -> list[bytes]:
        """The frames that withdraw ``request_id`` from the server."""
        return request_frames(self.options.identity, CANCEL, request_id)

    # -- errors ------------------------------------------------------------------------

    def timeout_error(
        self, what: str, refusal: BertClientError | None, timeout_ms: float | None = None
    ) -> BertClientError:
        """The error for a wait for ``what`` that ran out after ``timeout_ms`` (by default the
        client's): the failed handshake ``refusal`` if there was one, since then the server never
        saw the client, else a timeout."""
        if refusal is not None:
            return refusal
        timeout_ms = self._timeout if timeout_ms is None else timeout_ms
        return ServerTimeoutError(
            f"no answer from the bertserve server at {self.address} (replies on port {self.options.port_out}) "
            f"to {what} within {timeout_ms:g} ms",
            address=self.address,
            timeout_ms=timeout_ms,
        )

    def cannot_connect(self, exc: Exception) -> BertClientError:
        """The error for sockets that could not be opened."""
        return BertClientError(f"cannot connect to {self.address}: {exc}")

    def malformed(self, exc: Exception) -> BertClientError:
        """The error for a reply that breaks the protocol."""
        return BertClientError(f"malformed reply from the server at {self.address}: {exc}")

    def zmq_failed(self, exc: Exception) -> BertClientError:
        """The error for a socket that failed."""
        return BertClientError(f"ZeroMQ failed talking to {self.address}: {exc}")

    # -- the calls, planned ------------------------------------------------------------

    def encode(
        self,
        texts: Sequence[Any],
        given: Mapping[str, Any],
        *,
        blocking: bool = True,
        show_tokens: bool = False,
        show_progress: bool = False,
    ) -> Call[Any]:
        """``encode`` with the options ``given`` to it (:class:`~.keywords.EncodeKeywords`), read
        and checked here, before anything is sent: the vectors of ``texts`` (``(vectors, tokens)``
        with ``show_tokens``), in the client's ``output_fmt``; with ``blocking=False`` the request id."""
        asked = dict(given)
        output = asked.pop("output", ENCODE_DEFAULTS["output"])
        options = self.encode_options("encode", asked, show_tokens=show_tokens)
        return self._encode(texts, options, blocking=blocking, show_progress=show_progress, output=output)

    def _encode(
        self,
        texts: Sequence[Any],
        options: EncodeOptions,
        *,
        blocking: bool = True,
        show_progress: bool = False,
        output: str | None = None,
    ) -> Call[Any]:
        """The plan of ``encode`` with ``options``, already checked."""
        if show_progress and not blocking:
            raise ValueError("show_progress needs blocking=True: fetch() collects a non-blocking request")
        if output is not None and output != "float":
            return (yield from self._encode_compact(texts, options, output, blocking, show_progress))
        texts = options.check_texts(texts)
        config = yield Config(options.model)
        output_fmt, check_length = self.options.output_fmt, self.options.check_length
        plan = plan_encode(
            options,
            texts,
            config,
            output_fmt=output_fmt,
            check_length=check_length,
            show_progress=show_progress,
            blocking=blocking,
        )
        if plan.warning:
            yield Warn(plan.warning)
        if plan.empty is not None:
            return shaped(plan.empty, [], options.show_tokens)
        if plan.chunk is not None:
            vectors, tokens = yield Chunks(texts, options, plan.chunk, plan.progress)
            return shaped(in_format(vectors, output_fmt), tokens, options.show_tokens)
        result = yield Encode(texts, options, output_fmt, fetchable=not blocking)
        if not blocking:
            return result  # the request id: fetch() collects its answer
        return shaped(result.embedding, result.tokens, options.show_tokens)

    def _encode_compact(
        self, texts: Sequence[Any], options: EncodeOptions, output: str, blocking: bool, show_progress: bool
    ) -> Call[Any]:
        """``encode`` in a compact form (``output``: int8, uint8, binary or ubinary)."""
        (kind,) = t.check_embedding_types(output, "output") if isinstance(output, str) else ("",)
        if not blocking:
            raise ValueError("output needs blocking=True: fetch() collects the float vectors")
        config = yield Config(options.model)
        t.check_calibrated([kind], options.normalize, config)
        answer = yield from self._encode(texts, options, show_progress=show_progress)
        vectors, tokens = answer if options.show_tokens else (answer, None)
        compacted = in_format(t.compact(vectors, kind, config), self.options.output_fmt)
        return shaped(compacted, tokens or [], options.show_tokens)

    def rerank(
        self, query: str, documents: Sequence[str], top_n: int | None, given: Mapping[str, Any]
    ) -> Call[list[Ranked]]:
        """``rerank`` with the options ``given`` to it (:class:`~.keywords.RerankOptions`):
        ``documents`` ranked by their relevance to ``query``, in one request."""
        asked = read_options(self._method("rerank"), given, RERANK_DEFAULTS)
        return self._rerank(query, documents, top_n, **asked)

    def _rerank(
        self,
        query: str,
        documents: Sequence[str],
        top_n: int | None,
        *,
        raw_scores: bool,
        return_documents: bool,
        truncation_direction: str | None,
        model: str | None,
    ) -> Call[list[Ranked]]:
        pairs = t.rerank_pairs(query, documents)
        top_n = t.check_top(top_n, "top_n")
        rows, config = yield from self._task_rows(pairs, "rerank", model, truncation_direction)
        return t.rerank_answer(rows, config, documents, top_n, raw_scores=raw_scores, return_documents=return_documents)

    def predict(
        self, inputs: Sequence[str | tuple[str, str]], given: Mapping[str, Any]
    ) -> Call[list[list[Prediction]]]:
        """``predict`` with the options ``given`` to it (:class:`~.keywords.PredictOptions`):
        each input's labels, best first, with their scores."""
        asked = read_options(self._method("predict"), given, PREDICT_DEFAULTS)
        return self._predict(inputs, **asked)

    def _predict(
        self,
        inputs: Sequence[str | tuple[str, str]],
        *,
        raw_scores: bool,
        truncation_direction: str | None,
        model: str | None,
    ) -> Call[list[list[Prediction]]]:
        texts = t.predict_inputs(inputs)
        rows, config = yield from self._task_rows(texts, "classify", model, truncation_direction)
        return t.predictions(rows, config.get("labels") or (), raw_scores=raw_scores)

    def encode_sparse(self, texts: Sequence[str], given: Mapping[str, Any]) -> Call[list[SparseVector]]:
        """``encode_sparse`` with the options ``given`` to it (:class:`~.keywords.SparseOptions`):
        each text's non-zero SPLADE weights."""
        asked = read_options(self._method("encode_sparse"), given, SPARSE_DEFAULTS)
        return self._encode_sparse(texts, **asked)

    def _encode_sparse(
        self,
        texts: Sequence[str],
        *,
        top_k: int | None,
        prompt_name: str | None,
        truncation_direction: str | None,
        model: str | None,
    ) -> Call[list[SparseVector]]:
        top_k = t.check_top(top_k, "top_k")
        checked = check_texts(texts, pairs=False)
        rows, _ = yield from self._task_rows(checked, "sparse", model, truncation_direction, prompt_name)
        return t.sparse_rows(rows, top_k)

    def encode_multivector(self, texts: Sequence[str], given: Mapping[str, Any]) -> Call[list[np.ndarray]]:
        """``encode_multivector`` with the options ``given`` to it (:class:`~.keywords.MultivectorOptions`):
        each text's token vectors, ``(tokens, dim)`` float32 arrays."""
        asked = read_options(self._method("encode_multivector"), given, MULTIVECTOR_DEFAULTS)
        is_query = asked.pop("is_query")
        if not isinstance(is_query, bool):
            raise TypeError(f"is_query must be True or False, not {is_query!r}")
        checked = check_texts(texts, pairs=False)
        rows, _ = yield from self._task_rows(checked, "multivector", **asked, is_query=is_query)
        return late.multivector_rows(rows)

    def encode_outputs(self, texts: Sequence[str], given: Mapping[str, Any]) -> Call[list[dict[str, Any]]]:
        """``encode_outputs`` with the options ``given`` to it (:class:`~.keywords.OutputsOptions`):
        each text's outputs asked for, all from one model run, as a dict: ``embed`` its vector,
        ``sparse`` a :class:`SparseVector`, ``multivector`` its ``(tokens, dim)`` array."""
        asked = read_options(self._method("encode_outputs"), given, OUTPUTS_DEFAULTS)
        outputs = late.check_outputs(asked.pop("outputs"))
        # without a model, the server's default model of the rarest output asked for
        checked = check_texts(texts, pairs=False)
        rows, config = yield from self._task_rows(checked, outputs[-1], **asked, outputs=outputs)
        dims = {"embed": int(config.get("output_dim") or 0), "multivector": int(config.get("multivector_dim") or 0)}
        return late.unpack_outputs(rows, outputs, dims)

    def encode_options(self, method: str, given: Mapping[str, Any], *, show_tokens: bool = False) -> EncodeOptions:
        """The request options ``given`` to the client's ``method``, read and checked
        (:func:`~.requests.encode_options`), the client's model if they name none."""
        return encode_options(self._method(method), given, self.options.model, show_tokens=show_tokens)

    def _method(self, name: str) -> str:
        """The client's method ``name`` as Python names it in an error: ``"BertClient.encode"``."""
        return f"{self.client}.{name}"

    def _task_rows(
        self,
        texts: list[str],
        task: str,
        model: str | None,
        truncation_direction: str | None,
        prompt_name: str | None = None,
        is_query: bool = False,
        outputs: tuple[str, ...] | None = None,
    ) -> Call[tuple[np.ndarray, dict[str, Any]]]:
        """The rows a model of ``task`` answers for ``texts`` (one request), and its configuration;
        with ``outputs``, the packed outputs of a late-interaction model (``task``: the one
        whose default model is asked, when none is named)."""
        model = check_model(model) or self.options.model
        if model is None:  # the server's default model of the task
            model = t.task_default((yield Config(None)), task)
        options = EncodeOptions(
            prompt_name=prompt_name,
            truncation_direction=truncation_direction,
            model=model,
            task=None if outputs else task,
            is_query=is_query or None,
            outputs=outputs,
        )
        config = yield Config(options.model)
        options.check_server(config)
        result = yield Encode(texts, options, "ndarray")
        return np.asarray(result.embedding), config
