"""``--help`` that reads: ``bertserve start --help`` on one screen, its flags under headings,
each fixed set of values shown, ``--cpu, --no-cpu``, the rarely used flags behind
``--help-all``, and every flag described in the docs the help points to. The command runs in
this process (``main(argv)``), as it prints the same help there."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest
from bertserve.server import BertServeError
from bertserve.server.cli import flag_help, flags, main as cli, serving_flags, worker_flags

ROOT = Path(__file__).resolve().parents[4]
START_FLAGS = [*flags.MODEL_FLAGS, *flags.SERVER_FLAGS, *serving_flags.TELEMETRY_FLAGS]
WORKER_FLAGS = [*worker_flags.WORKER_FLAGS, *serving_flags.TELEMETRY_FLAGS]
COMMAND_FLAGS = {"start": START_FLAGS, "worker": WORKER_FLAGS, "embed": flags.MODEL_FLAGS}
HEADINGS = [
    "model",
    "serving",
    "limits and overload",
    "workers and devices",
    "HTTP and gRPC",
    "security",
    "several models and model versions",
]


def _bertserve(*argv: str, columns: int = 100) -> str:
    """What the command prints, run in this process, with the environment's BERTSERVE_ defaults left out."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        for name in os.environ:
            if name.startswith("BERTSERVE_"):
                patch.delenv(name)
        patch.setenv("COLUMNS", str(columns))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exited:
            cli.main(list(argv))
    assert exited.value.code == 0, err.getvalue()
    return out.getvalue()


def _shown(text: str, name: str) -> bool:
    return re.search(rf"(?m)^ +(?:\S+, )*{re.escape(name)}(?![\w-])", text) is not None


def test_start_help_fits_on_a_screen() -> None:
    lines = _bertserve("start", "--help").splitlines()
    assert len(lines) <= 100, len(lines)
    narrow = _bertserve("start", "--help", columns=80).splitlines()
    assert len(narrow) <= 120, len(narrow)


def test_start_help_groups_the_flags_under_headings() -> None:
    text = _bertserve("start", "--help")
    places = [text.index(f"\n{heading}:\n") for heading in HEADINGS]
    assert places == sorted(places)
    assert text.index("\nHTTP and gRPC:\n") < text.index("--http-port PORT") < text.index("\nsecurity:\n")
    assert text.index("--http-port PORT") < text.index("--grpc-port PORT") < text.index("\nsecurity:\n")


def test_start_help_shows_choices_and_both_forms_of_a_switch() -> None:
    text = _bertserve("start", "--help")
    for shown in (
        "--dtype {auto,fp32,bf16,fp16,int8}",
        "--long-inputs {truncate,chunk}",
        "--pooling-strategy {NONE,REDUCE_MEAN,REDUCE_MAX,REDUCE_MEAN_MAX,REDUCE_MEAN_SQRT_LEN,WEIGHTED_MEAN,"
        "CLS_TOKEN,SEP_TOKEN,CLS_POOLED}",
        "--cpu, --no-cpu",
        "--merge-requests, --no-merge-requests",
        "--normalize, --no-normalize",
        "--port PORT",
        "--max-latency-ms MS",
    ):
        assert shown in text, shown
    assert "[CPU]" not in text and "DTYPE" not in text
    flat = " ".join(text.split())
    assert "run on the CPU even where a GPU is visible (default: off)" in flat
    assert "into one mini-job (default: on)" in flat
    assert "L2-normalize the output (default: what the model says)" in flat  # neither on nor off: the model's


@pytest.mark.parametrize("command", sorted(COMMAND_FLAGS))
def test_help_all_shows_every_flag_and_help_says_how_many_it_leaves_out(command: str) -> None:
    short, every = _bertserve(command, "--help"), _bertserve(command, "--help-all")
    rare = [flag.name for flag in COMMAND_FLAGS[command] if flag.rare]
    assert [flag.name for flag in COMMAND_FLAGS[command] if not _shown(every, flag.name)] == []
    assert [name for name in rare if _shown(short, name)] == []
    assert [flag.name for flag in COMMAND_FLAGS[command] if not flag.rare and not _shown(short, flag.name)] == []
    assert f"{len(rare)} more flags: bertserve {command} --help-all." in " ".join(short.split())
    assert "more flags" not in every and "--help-all" in short


@pytest.mark.parametrize("command", sorted(COMMAND_FLAGS))
def test_every_flag_is_described_in_the_docs_the_help_names(command: str) -> None:
    named = re.search(r"Every flag is described in (.+)\.", " ".join(_bertserve(command, "--help").split()))
    assert named is not None
    docs = "".join((ROOT / path).read_text(encoding="utf-8") for path in named.group(1).split(" and "))
    missing = [flag.name for flag in COMMAND_FLAGS[command] if not re.search(rf"(?<![\w-]){flag.name}(?![\w-])", docs)]
    assert missing == []


def test_every_start_flag_is_written_out_in_the_server_page() -> None:
    page = (ROOT / "docs" / "server.md").read_text(encoding="utf-8")
    assert [flag.name for flag in START_FLAGS if not re.search(rf"`{flag.name}(?![\w-])", page)] == []


def test_every_flag_has_a_heading_of_its_own_list() -> None:
    for flag in [*START_FLAGS, *WORKER_FLAGS]:
        assert flag.group in flag_help.GROUPS, flag.name


def test_the_command_list_starts_with_start() -> None:
    text = _bertserve("--help")
    listed = re.findall(r"(?m)^ {4}(\w+) ", text)
    assert listed[:3] == ["start", "worker", "encode"]
    assert sorted(listed) == sorted(
        [
            "start",
            "worker",
            "encode",
            "rerank",
            "status",
            "stop",
            "reload",
            "keygen",
            "embed",
            "calibrate",
            "export",
            "manifest",
            "models",
        ]
    )


def _start(argv: list[str]):
    return flags.server_config_from_args(cli.build_parser().parse_args(["start", "--model-dir", "/m", *argv]))


@pytest.mark.parametrize(
    ("argv", "merge", "normalize"),
    [
        ([], True, None),
        (["--no-merge-requests", "--normalize"], False, True),
        (["--merge-requests", "false", "--normalize", "true"], False, True),  # the word form of earlier versions
        (["--merge-requests", "--no-normalize"], True, False),
    ],
)
def test_switches_take_the_no_form_and_the_word_form(argv: list[str], merge: bool, normalize: bool | None) -> None:
    config = _start(argv)
    assert (config.batching.merge_requests, config.model.normalize) == (merge, normalize)


def test_other_spellings_the_config_takes_pass_the_choices() -> None:
    model = _start(
        ["--dtype", "half", "--pooling-strategy", "first_token", "--long-inputs", "CHUNK", "--output-dtype", "fp16"]
    ).model
    assert (model.dtype, model.pooling_strategy.value, model.long_inputs, model.output_dtype) == (
        "fp16",
        "CLS_TOKEN",
        "chunk",
        "float16",
    )


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--dtype", "fp64"], "argument --dtype: invalid choice: 'fp64' (choose from 'auto', 'fp32', 'bf16'"),
        (["--feed", "queue"], "invalid choice: 'queue' (choose from 'thread', 'tfdata')"),
        (["--no-cpu", "true"], "argument --cpu/--no-cpu: --no-cpu takes no value"),
        (["--cpu", "maybe"], "argument --cpu/--no-cpu: expected true or false, not 'maybe'"),
    ],
)
def test_a_bad_value_gets_argparses_error(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.build_parser().parse_args(["start", *argv])
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_the_environment_still_sets_switches_and_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BERTSERVE_MERGE_REQUESTS", "false")
    monkeypatch.setenv("BERTSERVE_CPU", "yes")
    monkeypatch.setenv("BERTSERVE_DTYPE", "bfloat16")
    config = _start([])
    assert (config.batching.merge_requests, config.workers.cpu, config.model.dtype) == (False, True, "bf16")
    assert _start(["--merge-requests"]).batching.merge_requests is True
    monkeypatch.setenv("BERTSERVE_DTYPE", "fp64")
    with pytest.raises(BertServeError, match="BERTSERVE_DTYPE='fp64': choose one of auto, fp32, bf16, fp16, int8"):
        cli.build_parser()
