"""TEI's ``Info`` and ``Tokenize`` services: what a model is, and its tokenizer's tokens of a text
and text of token ids. Tokenizing needs no worker, only the model's tokenizer, which this process
holds; a call waits its turn in the tokenizing pool as an HTTP ``/tokenize`` does."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc
from bertserve.client import __version__
from bertserve.client.tei import tei_pb2 as pb

from ..http.disconnects import Call
from ..http.options import checked_prompt_name, prompted
from ..http.schemas import HTTPError, checked_texts
from ..http.tei import tokenized
from ..http.turns import AT_ONCE
from .service import Service, decoded

_MODEL_TYPES = {"classify": pb.MODEL_TYPE_CLASSIFIER, "rerank": pb.MODEL_TYPE_RERANKER}


class Tokens(Service):
    """The methods of TEI's ``Info`` and ``Tokenize`` services."""

    # -- Info --

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        async with self.guard.call(context, "tei.v1.Info/Info"):
            model = self.api.catalog.pick(self.guard.model(context))
            await self.api.ready_or_503()
            info = await self.api.catalog.info(model)
            commit = info.get("model_commit")
            return pb.InfoResponse(
                version=__version__,
                model_id=model.name,
                model_sha=commit if isinstance(commit, str) else None,
                model_dtype=str(info.get("dtype") or ""),
                model_type=_MODEL_TYPES.get(str(info.get("task")), pb.MODEL_TYPE_EMBEDDING),
                max_concurrent_requests=self.guard.options.max_grpc_calls,
                max_input_length=model.tokenizer.max_len,
                max_batch_tokens=int(info.get("max_batch_tokens") or 0),
                max_client_batch_size=self.api.settings.max_inputs,
                tokenization_workers=AT_ONCE,
            )

    # -- Tokenize --

    async def Tokenize(self, request: pb.EncodeRequest, context: grpc.aio.ServicerContext) -> pb.EncodeResponse:
        return await self._one(context, "tei.v1.Tokenize/Tokenize", self._tokenize, request)

    def TokenizeStream(
        self, requests: AsyncIterator[pb.EncodeRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.EncodeResponse]:
        return self._each(context, "tei.v1.Tokenize/TokenizeStream", self._tokenize, requests)

    async def _tokenize(
        self, call: Call, name: str | None, requests: Sequence[pb.EncodeRequest]
    ) -> list[pb.EncodeResponse]:
        api = self.api
        model = api.catalog.pick(name)
        texts = api.within_limits(checked_texts([r.inputs for r in requests], "inputs"), "inputs")
        info = await api.catalog.said(model)
        first = requests[0]
        prompt = first.prompt_name if first.HasField("prompt_name") else None
        tokens = await api.tokenized(
            call,
            tokenized,
            model.tokenizer,
            prompted(texts, checked_prompt_name(prompt, info), info),
            add_special_tokens=first.add_special_tokens,
            truncate=False,
            direction="right",
        )
        return [pb.EncodeResponse(tokens=[pb.SimpleToken(**token) for token in each]) for each in tokens]

    async def Decode(self, request: pb.DecodeRequest, context: grpc.aio.ServicerContext) -> pb.DecodeResponse:
        return await self._one(context, "tei.v1.Tokenize/Decode", self._decode, request)

    def DecodeStream(
        self, requests: AsyncIterator[pb.DecodeRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.DecodeResponse]:
        return self._each(context, "tei.v1.Tokenize/DecodeStream", self._decode, requests)

    async def _decode(
        self, call: Call, name: str | None, requests: Sequence[pb.DecodeRequest]
    ) -> list[pb.DecodeResponse]:
        model = self.api.catalog.pick(name)
        if sum(len(r.ids) for r in requests) > self.api.settings.max_inputs * model.tokenizer.max_len:
            raise HTTPError(
                413, "the ids are more than the longest request holds (--max-request-size inputs)", code="limit"
            )
        texts = []
        for r in requests:
            try:
                texts.append(
                    await self.api.tokenized(call, decoded, model.tokenizer, list(r.ids), r.skip_special_tokens)
                )
            except ValueError as exc:
                raise HTTPError(422, str(exc), param="ids") from None
        return [pb.DecodeResponse(text=text) for text in texts]
