"""The worker link's schemas: what each message kind accepts, and the one line that says why not."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from bertserve.client import protocol as p
from bertserve.server.errors import ConfigError
from bertserve.server.serving.protocol import link as schema, link_bodies as bodies, wire
from bertserve.server.serving.remote.config import HostConfig

READY = {"worker": 0, "pid": 7, "credits": 2, "device": "/CPU:0", "hostname": "far"}
RESULT = {
    "parts": [{"key": "a#1@0", "rows": [0, 1]}, {"key": "b#1@1", "rows": [0]}],
    "dtype": "float32",
    "shape": [3, 4],
    "truncated": [False, True, False],
}


def raw(obj: Any) -> bytes:
    return p.dumps(obj)


def refused(frames: list[bytes], direction: Any = schema.from_host) -> str:
    with pytest.raises(schema.LinkError) as caught:
        direction(frames)
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400
    return message


def test_ready_parses_into_typed_fields() -> None:
    message = schema.from_host([wire.READY, b"w0-7", raw({**READY, "model": {"output_dim": 4, "dtype": "float32"}})])
    assert isinstance(message, schema.WorkerReady) and message.worker == b"w0-7"
    ready = message.ready
    assert (ready.worker, ready.pid, ready.credits, ready.device, ready.version) == (0, 7, 2, "/CPU:0", None)
    assert ready.model is not None and ready.model.public() == {"output_dim": 4, "dtype": "float32"}
    moved = ready.model.model_copy(update={"model_dir": "/head/model"})
    assert moved.public() == {"output_dim": 4, "dtype": "float32", "model_dir": "/head/model"}


@pytest.mark.parametrize("key", ["protocol", "server_version", "curve", "max_message_bytes", "ready", "extra"])
def test_a_model_description_with_an_undeclared_key_is_refused(key: str) -> None:
    said = refused([wire.READY, b"w0-7", raw({**READY, "model": {"output_dim": 4, key: 1}})])
    assert f"model.{key}" in said and "not permitted" in said


def test_a_worker_of_this_machine_has_its_undeclared_fields_left_out() -> None:
    body = raw({**READY, "model": {"output_dim": 4, "colours": ["a", "b"], "protocol": 9}})
    ready = schema.local_ready([wire.READY, body])
    assert ready.model is not None and ready.model.public() == {"output_dim": 4}
    passed_on = schema.declared_ready(body)
    assert p.loads(passed_on)["model"] == {"output_dim": 4}
    message = schema.from_host([wire.READY, b"w0-7", passed_on])  # what a host passes on, the head takes
    assert isinstance(message, schema.WorkerReady) and message.ready.model is not None


def test_a_peer_that_has_not_joined_is_read_for_a_small_hello_only() -> None:
    hello = raw({"link": 1, "hostname": "far", "model_sha256": "ab" * 32})
    assert schema.is_hello([wire.HELLO, hello]) and schema.hello([wire.HELLO, hello]).hostname == "far"
    assert not schema.is_hello([wire.RESULT, b"w0-1", b"1", b"{}", b""]) and not schema.is_hello([])
    padded = raw({"link": 1, "hostname": "far", "pad": "x" * schema.MAX_HELLO_BYTES})
    assert "at most 4096" in refused([wire.HELLO, padded], schema.hello)
    assert "frame(s) after its kind" in refused([wire.HELLO, hello, b"more"], schema.hello)


def test_a_result_header_is_bounded_by_its_job() -> None:
    assert schema.result_of([wire.RESULT, b"w0-1", b"17", b"{}", b""]) == (b"w0-1", "17")
    assert schema.result_of([wire.DONE, b"{}"]) is None and schema.result_of([wire.RESULT, b"w0-1"]) is None
    plain = schema.result_header_bound(rows=2, parts=1)
    assert plain < 32 * 1024
    with_tokens = schema.result_header_bound(rows=2, parts=1, texts=["x" * 1000, ["tok", "ens"]])
    assert with_tokens >= plain + 16 * 1008
    assert schema.result_header_bound(rows=10**9, parts=1) == schema.MAX_RESULT_HEADER_BYTES
    header = raw(
        {
            "parts": [{"key": "k", "rows": [0]}],
            "dtype": "float32",
            "shape": [1, 4],
            "truncated": [False],
            "pad": "x" * 2000,
        }
    )
    frames = [wire.RESULT, b"w0-1", b"1", header, b"\0" * 16]
    assert isinstance(schema.from_host(frames), schema.WorkerResult)
    assert "at most 1000" in refused(frames, lambda f: schema.from_host(f, result_header_bytes=1000))


@pytest.mark.parametrize(
    "credits",
    [
        b"1e999",
        b"-1e999",
        b"NaN",
        b"Infinity",
        b"-1",
        b"0",
        b"1.0",
        b"true",
        b'"2"',
        b"null",
        b"[1]",
        b"2147483648",
        b"1" * 400,
    ],
)
def test_credits_must_be_a_positive_integer_in_range(credits: bytes) -> None:
    body = b'{"worker":0,"pid":7,"credits":' + credits + b"}"
    assert "credits" in refused([wire.READY, b"w0-7", body])


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seconds", math.nan),
        ("seconds", math.inf),
        ("seconds", -1.0),
        ("seconds", "0.1"),
        ("tokens", -5),
        ("tokens", 2**64),
        ("slots", 1.5),
        ("job", ""),
        ("job", "x" * 65),
        ("job", "1\n2"),
        ("worker", 7),
    ],
)
def test_done_refuses_bad_numbers_and_names(field: str, value: Any) -> None:
    body = json.dumps({"job": "12.0", "worker": "w0-7", field: value}).encode()  # json writes NaN and Infinity
    assert field in refused([wire.DONE, body])


def test_done_needs_its_job_and_worker_and_fills_in_its_statistics() -> None:
    assert "worker" in refused([wire.DONE, raw({"job": "1"})])
    done = schema.from_host([wire.DONE, raw({"job": "1", "worker": "w0-7", "unknown": {"ignored": True}})])
    assert done == bodies.Done(job="1", worker="w0-7", seconds=0.0, tokens=0, slots=0)


@pytest.mark.parametrize(
    ("frames", "said"),
    [
        ([], "empty"),
        ([b"NOPE"], "unknown kind 'NOPE'"),
        ([b"X" * 1000], "unknown kind"),
        ([wire.HELLO], "0 frame"),
        ([wire.DRAIN, b"x"], "1 frame"),
        ([wire.BYE, b"", b""], "2 frame"),
        ([wire.READY, b"w0"], "1 frame"),
        ([wire.HEARTBEAT, b"w0", b"w1"], "2 frame"),
        ([wire.RESULT, b"w0", b"1", b"{}"], "3 frame"),
        ([wire.GONE], "0 frame"),
        ([wire.JOB, b"w0", b"1", b"{}", b"[]"], "unknown kind"),
        ([wire.WELCOME, b"{}"], "unknown kind"),
        ([wire.READY, b"w0", b"\xff\xfe"], "Invalid JSON"),
        ([wire.READY, b"w0", b"[" * 10_000], "JSON"),
        ([wire.READY, b"w0", b"[]"], "object"),
        ([wire.DONE, b" " * (schema.MAX_CONTROL_BYTES + 1)], "at most"),
        ([wire.READY, b"", raw(READY)], "worker name"),
        ([wire.READY, b"w" * 65, raw(READY)], "worker name"),
        ([wire.READY, b"../w0", raw(READY)], "worker name"),
        ([wire.HEARTBEAT, b"w0\x00"], "worker name"),
        ([wire.RESULT, b"w0", b"", raw(RESULT), b"\0" * 48], "job id"),
    ],
)
def test_a_message_of_the_wrong_layout_is_refused_with_one_line(frames: list[bytes], said: str) -> None:
    assert said in refused(frames)


def test_a_hello_of_any_link_version_parses_so_it_can_be_refused_with_the_reason() -> None:
    hello = schema.from_host([wire.HELLO, raw({"link": 99, "future": "field"})])
    assert hello == bodies.Hello(link=99, version="?", hostname="?", model_sha256="", workers=1)
    assert "workers" in refused([wire.HELLO, raw({"link": 1, "workers": bodies.MAX_HOST_WORKERS + 1})])
    assert "hostname" in refused([wire.HELLO, raw({"link": 1, "hostname": "evil\x1b[2J"})])


def test_a_result_parses_when_its_rows_lists_and_buffer_agree() -> None:
    header = {**RESULT, "lengths": [3, 4, 5], "tokens": [["a"], ["b"], None], "model_version": None, "x": 1}
    message = schema.from_host([wire.RESULT, b"w0-7", b"3.1", raw(header), b"\0" * 48])
    assert isinstance(message, schema.WorkerResult) and message.job_id == "3.1"
    assert message.header.plain() == {**RESULT, "lengths": [3, 4, 5], "tokens": [["a"], ["b"], None]}


@pytest.mark.parametrize(
    ("changes", "buffer", "said"),
    [
        ({}, 47, "buffer holds 47 bytes"),
        ({"shape": [4, 4]}, 64, "4 rows, the parts 3"),
        ({"lengths": [1, 2]}, 48, "lengths has 2 entries"),
        ({"windows": [1, 1, 1, 1]}, 48, "windows"),
        ({"dtype": "object"}, 48, "dtype"),
        ({"shape": [3]}, 48, "shape"),
        ({"shape": [3, -4]}, 48, "shape"),
        ({"shape": [3, 2**40]}, 48, "shape"),
        ({"parts": []}, 48, "parts"),
        ({"parts": "all"}, 48, "parts"),
        ({"parts": [{"key": "a", "rows": [-1, 0, 1]}]}, 48, "rows"),
        ({"lengths": [1, math.inf, 1]}, 48, "lengths"),
        ({"truncated": [True, False]}, 48, "truncated has 2 entries"),
        ({"truncated": [0, 1, 0]}, 48, "truncated"),
        ({"truncated": ["true", "false", "false"]}, 48, "truncated"),
        ({"truncated": [None, None, None]}, 48, "truncated"),
        ({"truncated": None}, 48, "truncated"),
        ({"truncated": 3}, 48, "truncated"),
    ],
)
def test_a_result_that_does_not_add_up_is_refused(changes: dict[str, Any], buffer: int, said: str) -> None:
    body = json.dumps({**RESULT, **changes}).encode()
    assert said in refused([wire.RESULT, b"w0-7", b"3", body, b"\0" * buffer])


def test_a_result_that_does_not_say_which_rows_were_cut_is_refused() -> None:
    body = {key: value for key, value in RESULT.items() if key != "truncated"}
    assert "truncated: Field required" in refused([wire.RESULT, b"w0-7", b"3", raw(body), b"\0" * 48])


def test_a_job_errors_kind_is_one_of_a_fixed_set_and_its_text_is_cut() -> None:
    message = schema.from_host([wire.JOB_ERROR, b"w0-7", b"3", raw({"error": "x" * 10_000, "kind": "evil\nkind"})])
    assert isinstance(message, schema.WorkerError)
    assert message.error.safe_kind == "worker" and len(message.error.safe_error) == bodies.MAX_ERROR_CHARS + 3
    for kind in bodies.ERROR_KINDS:
        error = schema.from_host([wire.JOB_ERROR, b"w0-7", b"3", raw({"error": "bad", "kind": kind})])
        assert isinstance(error, schema.WorkerError) and error.error.safe_kind == kind
    assert "kind" in refused([wire.JOB_ERROR, b"w0-7", b"3", raw({"kind": 5})])


def test_gone_and_forget_reasons_are_cut_and_made_printable() -> None:
    gone = schema.from_host([wire.GONE, b"w0-7", b"died\n\x1b[31m" + b"!" * 500])
    assert isinstance(gone, schema.Gone) and gone.reason.startswith("died\\n\\x1b[31m") and len(gone.reason) < 220
    assert schema.from_host([wire.GONE, b"w0-7"]) == schema.Gone(b"w0-7", "its process died")
    assert schema.from_head([wire.FORGET, b"w0-7"]) == schema.Forget(b"w0-7", "it stopped answering")


def welcome(**model: Any) -> list[bytes]:
    return [wire.WELCOME, raw({"model": model, "model_class": None, "heartbeat_timeout_ms": 3000})]


@pytest.mark.parametrize(
    "name",
    [
        "/etc/passwd",
        "../vocab.txt",
        "sub/../../vocab.txt",
        "..",
        "C:\\vocab.txt",
        "..\\vocab.txt",
        "",
        "a\x00b",
        "\\\\server\\share\\vocab.txt",
    ],
)
@pytest.mark.parametrize("field", ["vocab_name", "config_name", "ckpt_name"])
def test_welcome_file_names_must_stay_inside_the_model_directory(field: str, name: str) -> None:
    message = refused(welcome(**{field: name}), schema.from_head)
    assert field in message


def test_a_welcome_with_plain_names_gives_model_options() -> None:
    message = schema.from_head(
        welcome(
            vocab_name="vocab.txt", ckpt_name="ckpt/model.ckpt", max_seq_len=40, pooling_layer=[-1, -2], normalize=None
        )
    )
    assert isinstance(message, bodies.Welcome)
    assert message.model.options() == {
        "vocab_name": "vocab.txt",
        "ckpt_name": "ckpt/model.ckpt",
        "max_seq_len": 40,
        "pooling_layer": [-1, -2],
    }


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"model": {"nope": 1}, "heartbeat_timeout_ms": 3000}, "nope"),
        ({"model": {}}, "heartbeat_timeout_ms"),
        ({"model": {}, "heartbeat_timeout_ms": 1e999}, "heartbeat_timeout_ms"),
        ({"model": {}, "heartbeat_timeout_ms": 3000, "model_class": "os:system; rm"}, "model_class"),
        ({"model": {"batch_size": 0}, "heartbeat_timeout_ms": 3000}, "batch_size"),
        ({"model": []}, "model"),
    ],
)
def test_a_welcome_that_breaks_its_schema_is_refused(body: dict[str, Any], said: str) -> None:
    with pytest.raises(schema.LinkError) as caught:
        schema.from_head([wire.WELCOME, json.dumps(body).encode()])
    assert said in str(caught.value) and caught.value.kind == wire.WELCOME


def test_a_host_imports_a_model_class_only_if_its_own_command_line_names_it() -> None:
    def config(model_class: str | None) -> HostConfig:
        return HostConfig(server="head", worker_port=1, model_dir="/here/model", model_class=model_class)

    def offer(model_class: str | None) -> bodies.Welcome:
        return bodies.Welcome(model=bodies.WelcomeModel(), model_class=model_class, heartbeat_timeout_ms=3000)

    with pytest.raises(ConfigError, match="pass --model-class evil:Model"):
        config(None).server_config(offer("evil:Model"))
    with pytest.raises(ConfigError, match="started with --model-class mine:Model"):
        config("mine:Model").server_config(offer("evil:Model"))
    with pytest.raises(ConfigError, match="leave it out"):
        config("mine:Model").server_config(offer(None))
    assert config("mine:Model").server_config(offer("mine:Model")).serving.model_class == "mine:Model"
    assert config(None).server_config(offer(None)).serving.model_class is None


def test_local_workers_ready_and_credits_use_the_same_schemas() -> None:
    assert schema.local_ready([wire.READY, raw(READY)]).credits == 2
    with pytest.raises(schema.LinkError, match="credits"):
        schema.local_ready([wire.READY, b'{"worker":0,"pid":7,"credits":1e999}'])
    assert schema.local_credit([wire.HEARTBEAT, b"w0-7"]) == schema.Heartbeat(b"w0-7")
    done = schema.local_credit([wire.DONE, raw({"job": "1", "worker": "w0-7", "seconds": 0.25})])
    assert isinstance(done, bodies.Done) and done.seconds == 0.25
    with pytest.raises(schema.LinkError):
        schema.local_credit([wire.READY, raw(READY)])


def test_printable_escapes_control_characters_and_cuts() -> None:
    assert bodies.printable("plain") == "plain"
    assert bodies.printable("a\nb\x1b", 10) == "a\\nb\\x1b"
    assert bodies.printable("x" * 500, 20) == "x" * 20


def test_a_models_labels_and_calibration_ranges_are_bounded() -> None:
    fine = bodies.ModelInfo(output_dim=2, task="classify", labels=["neg", "pos"], calibration_ranges=[[0, 0], [1, 1]])
    assert fine.public()["labels"] == ["neg", "pos"]
    bad = [
        {"output_dim": 2, "task": "translate"},
        {"output_dim": 2, "labels": ["x" * 256]},
        {"output_dim": 2, "labels": ["a"] * (bodies.MAX_LABELS + 1)},
        {"output_dim": 2, "activation": "softplus"},
        {"output_dim": 2, "calibration_ranges": [[0, 0], [1]]},
        {"output_dim": 2, "calibration_ranges": [[0, 0], [1, 1], [2, 2]]},
        {"output_dim": 2, "calibration_ranges": [[0, math.nan], [1, 1]]},
        {"output_dim": 2, "calibration_ranges": [[-1e300, 0], [1e300, 1]]},  # finite in float64 only
        {"output_dim": 2, "calibration_ranges": [[-3e38, 0], [3e38, 1]]},  # max - min overflows float32
        {"output_dim": 2, "calibration_ranges": [[1, 0], [0, 1]]},  # min above max
    ]
    for fields in bad:
        with pytest.raises(ValueError):
            bodies.ModelInfo(**fields)
