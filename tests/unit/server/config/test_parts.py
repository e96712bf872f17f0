"""The server's config is built from its parts, each from its own table of flags: every flag of
``bertserve start`` sets one field of one part, and each part is small."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from bertserve.server.cli import flags, worker_flags
from bertserve.server.config.model import FIELDS, ModelConfig
from bertserve.server.config.served import ModelServing, Routing
from bertserve.server.config.server import ServerConfig
from bertserve.server.config.workers import Workers


def _dests(table: tuple[flags.Flag, ...]) -> set[str]:
    return {flag.dest for flag in table}


def test_each_part_is_built_from_the_flags_named_like_its_fields() -> None:
    for name, table in flags.PART_FLAGS.items():
        fields = {field.name for field in dataclasses.fields(flags.PARTS[name])} - {"model_batch_size"}
        assert _dests(table) == fields, name
    serving = {field.name for field in dataclasses.fields(ModelServing)} - {"model"}
    assert _dests(flags.SERVING_TABLE) == serving
    routing = {field.name for field in dataclasses.fields(Routing)} - {"model_defaults", "tasks"}
    # --default-model gives the default model (NAME) and the tasks' (TASK=NAME)
    assert _dests(flags.ROUTING_TABLE) == (routing - {"default_model", "task_defaults"}) | {"default_models"}


def test_every_start_flag_sets_one_part_or_the_model() -> None:
    tables = [*flags.PART_FLAGS.values(), flags.SERVING_TABLE, flags.ROUTING_TABLE, tuple(flags.MODEL_FLAGS)]
    taken = [flag.name for table in tables for flag in table]
    assert sorted(set(taken)) == sorted({flag.name for flag in [*flags.SERVER_FLAGS, *flags.MODEL_FLAGS]})
    twice = {name for name in taken if taken.count(name) > 1}
    assert twice == {"--num-worker"}  # the workers' count, and each model's unless its --model says


def test_a_worker_host_takes_the_workers_part_of_the_head() -> None:
    assert _dests(worker_flags.HOST_WORKERS_TABLE) < {field.name for field in dataclasses.fields(Workers)}


def test_the_server_config_and_its_parts_are_small() -> None:
    parts = [field.type for field in dataclasses.fields(ServerConfig)]
    assert len(parts) <= 20
    model_parts = list(typing.get_type_hints(ModelConfig).values())
    for kind in [*flags.PARTS.values(), ModelServing, Routing, ModelConfig, *model_parts]:
        assert len(dataclasses.fields(kind)) <= 20, kind.__name__


def test_a_models_options_are_its_parts_and_go_by_their_flat_names() -> None:
    model = ModelConfig.of(model_dir="/m", dtype="half", max_seq_len="none", pooling_layer=-1, graph_dir="/g")
    assert (model.runtime.dtype, model.inputs.max_seq_len, model.output.pooling_layer) == ("fp16", "NONE", (-1,))
    assert (model.dtype, model.max_seq_len, model.pooling_layer, model.graph_dir) == ("fp16", "NONE", (-1,), "/g")
    assert list(model.flat()) == list(FIELDS) and model.flat()["pooling_layer"] == (-1,)
    changed = model.replace(batch_size=8, normalize=True)
    assert (changed.batch_size, changed.normalize, changed.source) == (8, True, model.source)
    with pytest.raises(TypeError, match="no option 'dtpye'"):
        ModelConfig.of(model_dir="/m", dtpye="fp16")
