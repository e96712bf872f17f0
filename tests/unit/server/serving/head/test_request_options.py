"""An ENCODE header's options, checked at the edge: each bad value refused with a message
naming the field; good ones become the request's deadline, prompt, side and dimensions."""

from __future__ import annotations

import math

import pytest
from bertserve.server.model.prompts import Prompts
from bertserve.server.serving.head.request_options import EncodeOptions, read_options
from bertserve.server.serving.policy.admission import Refusal
from bertserve.server.testing.config import server_config

CONFIG = server_config("unused", request_timeout_ms=10_000)
MODEL = {"output_dim": 8, "normalize": True}
PROMPTS = Prompts({"query": "query: ", "passage": "passage: "}, "query")


def read(header: dict, model: dict = MODEL, prompts: Prompts = PROMPTS) -> EncodeOptions:
    options = read_options(header, CONFIG, model, prompts)
    assert isinstance(options, EncodeOptions), options
    return options


def refusal(header: dict, model: dict = MODEL, prompts: Prompts = PROMPTS) -> Refusal:
    options = read_options(header, CONFIG, model, prompts)
    assert isinstance(options, Refusal), options
    return options


def test_a_bare_header_takes_the_servers_defaults() -> None:
    options = read({}, prompts=Prompts())
    assert (options.timeout_s, options.prompt, options.truncation, options.dimensions) == (10.0, "", "right", None)
    assert not options.is_tokenized and not options.show_tokens and not options.chunk


@pytest.mark.parametrize(("timeout_ms", "seconds"), [(500, 0.5), (2.5, 0.0025), (60_000, 10.0), (math.inf, 10.0)])
def test_the_deadline_is_the_clients_timeout_at_most_the_servers(timeout_ms: float, seconds: float) -> None:
    assert read({"timeout_ms": timeout_ms}).timeout_s == pytest.approx(seconds)


@pytest.mark.parametrize("timeout_ms", [0, -1, "1000", True, None, [], math.nan])
def test_a_bad_timeout_is_refused_by_name(timeout_ms: object) -> None:
    if timeout_ms is None:
        assert read({"timeout_ms": None}).timeout_s == 10.0  # absent and null are the same
        return
    assert "timeout_ms" in refusal({"timeout_ms": timeout_ms}).message


def test_dimensions_from_one_to_the_models_own() -> None:
    assert read({"dimensions": 1}).dimensions == 1 and read({"dimensions": 8}).dimensions == 8
    too_many = refusal({"dimensions": 9})
    assert "8 dimensions" in too_many.message and too_many.kind == "input"
    for bad in (0, -3, True, "4", 2.0):
        assert "dimensions must be an integer from 1 to 8" in refusal({"dimensions": bad}).message
    assert read({"dimensions": 4096}, model={}).dimensions == 4096  # no worker yet: the sink checks it


def test_prompts_by_name_and_by_default() -> None:
    assert read({}).prompt == "query: "
    assert read({"prompt_name": "passage"}).prompt == "passage: "
    unknown = refusal({"prompt_name": "Query"}).message
    assert "'Query'" in unknown and "query" in unknown and "passage" in unknown
    assert "--prompt" in refusal({"prompt_name": "query"}, prompts=Prompts()).message
    assert "string" in refusal({"prompt_name": 3}).message


def test_tokenized_inputs_take_no_prompt() -> None:
    assert read({"is_tokenized": True}).prompt == ""  # the default is for texts
    assert "text inputs" in refusal({"is_tokenized": True, "prompt_name": "query"}).message


def test_the_truncation_side_and_the_flags_are_checked() -> None:
    assert read({"truncation_direction": "left"}).truncation == "left"
    assert "truncation_direction" in refusal({"truncation_direction": "middle"}).message
    assert refusal({"is_tokenized": "yes"}).kind == "protocol"
    assert refusal({"show_tokens": 1}).kind == "protocol"
    assert "long_inputs must be truncate or chunk" in refusal({"long_inputs": "window"}).message


def test_a_request_asks_for_its_models_task_or_is_refused_naming_it() -> None:
    assert read({}).task == "embed"
    assert read({"task": "rerank"}, model={**MODEL, "task": "rerank"}).task == "rerank"
    wrong = refusal({"task": "rerank"})
    assert wrong.kind == "task" and "task embed" in wrong.message and "/v1/embeddings" in wrong.message
    vectors = refusal({}, model={**MODEL, "task": "sparse"})
    assert vectors.kind == "task" and "/embed_sparse" in vectors.message
    for bad in ("Rerank", "", 3, None, ["rerank"]):
        assert "task must be one of embed, rerank, classify, sparse" in refusal({"task": bad}).message
    assert (
        "dimensions applies to sentence vectors"
        in refusal({"task": "classify", "dimensions": 2}, model={**MODEL, "task": "classify"}).message
    )
