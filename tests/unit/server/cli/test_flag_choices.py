"""A flag of a fixed set of values takes its value in any case, on the command line, in its
``BERTSERVE_<FLAG>`` variable and in a ``--model``'s options; the pooling strategy also takes
sentence-transformers' and TEI's names (``mean``, ``max``, ``cls``). A value it does not take
is refused with the choices. The command runs in this process (``main(argv)``)."""

from __future__ import annotations

import contextlib
import io
import os

import pytest
from bertserve.server import BertServeError, ModelConfig
from bertserve.server.cli import flags, main as cli, serving_flags
from bertserve.server.config.model import PoolingStrategy
from bertserve.server.config.server import ServerConfig
from bertserve.server.errors import ModelOptionError

CHOOSING = [flag for flag in [*flags.MODEL_FLAGS, *flags.SERVER_FLAGS, *serving_flags.TELEMETRY_FLAGS] if flag.choices]
SPELLINGS = (str.lower, str.upper, str.title)  # reduce_mean, REDUCE_MEAN, Reduce_Mean


@pytest.fixture(autouse=True)
def _no_bertserve_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith("BERTSERVE_"):
            monkeypatch.delenv(name)


def _start(argv: list[str]) -> ServerConfig:
    return flags.server_config_from_args(cli.build_parser().parse_args(["start", "--model-dir", "/m", *argv]))


def test_every_flag_of_choices_is_tested() -> None:
    names = {flag.name for flag in CHOOSING}
    assert names >= {"--pooling-strategy", "--dtype", "--output-dtype", "--long-inputs", "--task", "--feed"}
    assert "--log-format" in names


@pytest.mark.parametrize("flag", CHOOSING, ids=lambda flag: flag.name)
def test_a_choice_is_taken_in_any_case_from_the_command_line(flag: flags.Flag) -> None:
    parser = cli.build_parser()
    for choice in flag.choices:
        for spell in SPELLINGS:
            args = parser.parse_args(["start", flag.name, spell(choice)])
            assert getattr(args, flag.dest) == choice, spell(choice)


@pytest.mark.parametrize("flag", CHOOSING, ids=lambda flag: flag.name)
def test_a_choice_is_taken_in_any_case_from_the_environment(flag: flags.Flag, monkeypatch: pytest.MonkeyPatch) -> None:
    for choice in flag.choices:
        for spell in SPELLINGS:
            monkeypatch.setenv(flag.env, spell(choice))
            assert getattr(cli.build_parser().parse_args(["start"]), flag.dest) == choice, spell(choice)


@pytest.mark.parametrize(
    ("given", "strategy"),
    [
        ("mean", "REDUCE_MEAN"),
        ("MEAN", "REDUCE_MEAN"),
        ("max", "REDUCE_MAX"),
        ("cls", "CLS_TOKEN"),
        ("Cls", "CLS_TOKEN"),
        ("reduce_mean", "REDUCE_MEAN"),
        ("Reduce_Mean", "REDUCE_MEAN"),
        ("last-token", "SEP_TOKEN"),  # TEI's
        ("lasttoken", "SEP_TOKEN"),  # sentence-transformers'
        ("mean_sqrt_len_tokens", "REDUCE_MEAN_SQRT_LEN"),
        ("weightedmean", "WEIGHTED_MEAN"),
    ],
)
def test_the_pooling_strategy_takes_the_short_names(given: str, strategy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ModelConfig.of(model_dir="", pooling_strategy=given).pooling_strategy is PoolingStrategy(strategy)
    model = _start(["--pooling-strategy", given]).model
    assert model.pooling_strategy is PoolingStrategy(strategy)
    monkeypatch.setenv("BERTSERVE_POOLING_STRATEGY", given)
    assert _start([]).model.pooling_strategy is PoolingStrategy(strategy)


def test_a_models_options_take_any_case_and_the_short_names() -> None:
    config = flags.server_config_from_args(
        cli.build_parser().parse_args(
            [
                "start",
                "--model",
                "a=/m/a,pooling_strategy=mean,dtype=FP32,long_inputs=Chunk,task=EMBED",
                "--model",
                "b=/m/b,pooling_strategy=Reduce_Max,output_dtype=Float16",
            ]
        )
    )
    models = {served.name: served.model for served in config.models}
    assert (models["a"].pooling_strategy, models["a"].dtype, models["a"].long_inputs, models["a"].task) == (
        PoolingStrategy.REDUCE_MEAN,
        "fp32",
        "chunk",
        "embed",
    )
    assert (models["b"].pooling_strategy, models["b"].output_dtype) == (PoolingStrategy.REDUCE_MAX, "float16")


def test_a_value_not_taken_is_refused_with_the_choices() -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exited:
        cli.main(["start", "--pooling-strategy", "average"])
    assert exited.value.code == 2
    said = err.getvalue()
    assert "argument --pooling-strategy: invalid choice: 'average'" in said
    assert "'REDUCE_MEAN'" in said and "'CLS_TOKEN'" in said
    with pytest.raises(ModelOptionError, match="unknown pooling_strategy 'average'; choose one of NONE, REDUCE_MEAN"):
        ModelConfig.of(model_dir="", pooling_strategy="average")


def test_a_value_not_taken_from_the_environment_is_refused_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTSERVE_FEED", "queue")
    with pytest.raises(BertServeError, match="BERTSERVE_FEED='queue': choose one of thread, tfdata"):
        cli.build_parser()


def test_a_models_option_not_taken_is_refused_with_the_choices() -> None:
    args = cli.build_parser().parse_args(["start", "--model", "a=/m/a,pooling_strategy=average"])
    with pytest.raises(BertServeError, match="--model a: unknown pooling_strategy 'average'; choose one of NONE"):
        flags.server_config_from_args(args)
