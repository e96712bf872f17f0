"""Admission and the control answers as pure decisions: no sockets, no model, milliseconds."""

from __future__ import annotations

import sys

import pytest
from bertserve.server.config.model import ModelConfig
from bertserve.server.config.server import ServerConfig
from bertserve.server.serving.head.control import Control
from bertserve.server.serving.policy import admission
from bertserve.server.serving.policy.admission import Refusal
from bertserve.server.serving.policy.scheduler import Scheduler
from bertserve.server.testing.config import server_config


def _config(**options: object) -> ServerConfig:
    return server_config("unused", **options)


def test_a_count_over_the_request_size_is_a_limit_and_over_the_queues_is_busy() -> None:
    config = _config(max_request_size=10, max_queued_sentences=20, max_client_queued_sentences=20)
    scheduler = Scheduler(config.batching, config.limits)
    assert admission.check_count(10, config.limits, scheduler, b"c") is None
    too_big = admission.check_count(11, config.limits, scheduler, b"c")
    assert too_big is not None and too_big.kind == "limit" and "at most 10 per request" in too_big.message
    scheduler.queue("k", b"c", ["x"] * 10, is_tokenized=False, show_tokens=False, now=0.0, chunk=False)
    scheduler.queue("k2", b"d", ["x"] * 10, is_tokenized=False, show_tokens=False, now=0.0, chunk=False)
    full = admission.check_count(5, config.limits, scheduler, b"e")
    assert full is not None and full.kind == admission.BUSY


def test_bytes_that_never_fit_are_a_limit_and_bytes_that_fit_later_are_busy() -> None:
    assert admission.check_bytes(100, 0, 1000) is None
    assert admission.check_bytes(100, 900, 1000) is None
    never = admission.check_bytes(2000, 0, 1000)
    later = admission.check_bytes(200, 900, 1000)
    assert never is not None and never.kind == "limit" and "--max-queued-bytes" in never.message
    assert later is not None and later.kind == admission.BUSY and "retry" in later.message


def test_held_bytes_count_every_text_and_token() -> None:
    texts = ["a" * 1000, "b"]
    assert admission.held_bytes(texts) >= 1001 + sys.getsizeof([])
    tokenized = [["hello", "world"]]
    assert admission.held_bytes(tokenized) > admission.held_bytes([[]])
    wide = ["\U0001f600" * 100]  # four bytes a character as Python stores it
    assert admission.held_bytes(wide) >= 400


def test_the_first_text_over_the_length_limit_is_named() -> None:
    assert admission.check_lengths(["abc", ["ab", "c"]], 3) is None
    refusal = admission.check_lengths(["abc", "abcd", "abcde"], 3)
    assert refusal == Refusal("texts[1] has 4 characters; this server takes at most 3", "limit")


def test_a_pending_request_id_is_refused_as_a_duplicate() -> None:
    assert admission.check_unique(7, pending=False) is None
    refusal = admission.check_unique(7, pending=True)
    assert refusal is not None and refusal.kind == "duplicate" and "request id 7" in refusal.message


def test_chunking_follows_the_request_then_the_server_and_the_model_may_refuse_it() -> None:
    chunks = _config(model=ModelConfig.of(model_dir="unused", long_inputs="chunk")).model.long_inputs
    assert admission.chunking(None, chunks, {}) == (True, None)
    assert admission.chunking("truncate", chunks, {"chunking": False}) == (False, None)
    assert admission.chunking("chunk", chunks, {"chunking": True}) == (True, None)
    chunk, refusal = admission.chunking("chunk", chunks, {"chunking": False, "pooling_strategy": "CLS_TOKEN"})
    assert not chunk and refusal is not None and "CLS_TOKEN" in refusal.message
    chunk, refusal = admission.chunking("sideways", chunks, {})
    assert not chunk and refusal is not None and refusal.kind == "input"


def test_a_key_is_the_principal_except_the_gateways() -> None:
    assert admission.principal(b"client", None, None) == b"client"
    assert admission.principal(b"client", b"KEY", b"GATEWAY") == b"key:KEY"
    assert admission.principal(b"caller-7", b"GATEWAY", b"GATEWAY") == b"caller-7"


# -- control answers ---------------------------------------------------------------------------


def test_terminate_is_taken_on_loopback_and_refused_beyond_it_unless_allowed() -> None:
    control = Control(_config(), admins=None, remote_workers=False)
    assert control.terminate(None) == {"stopping": True} and control.terminate_requested
    exposed = Control(_config(bind="0.0.0.0"), admins=None, remote_workers=False)
    refusal = exposed.terminate(None)
    assert isinstance(refusal, Refusal) and refusal.kind == "forbidden" and not exposed.terminate_requested
    allowed = Control(_config(bind="0.0.0.0", allow_terminate=True), admins=None, remote_workers=False)
    assert allowed.terminate(None) == {"stopping": True}


def test_under_curve_only_admin_keys_may_reload() -> None:
    control = Control(_config(), admins=frozenset([b"ADMIN"]), remote_workers=False)
    refusal = control.reload({}, b"SOMEONE", 1)
    assert isinstance(refusal, Refusal) and "admins/" in refusal.message
    assert control.take_reload() is None
    assert control.reload({"version": "3"}, b"ADMIN", 1) == {"reload": 1, "wanted": "3", "model_version": 1}
    assert control.take_reload() == ("3", 1) and control.take_reload() is None


@pytest.mark.parametrize(
    ("header", "version", "remote", "needle"),
    [
        ({}, None, False, "not a repository"),
        ({}, 1, True, "remote workers"),
        ({"version": "newest"}, 1, False, "latest or a version number"),
        ({"version": "1" * 10}, 1, False, "latest or a version number"),
    ],
)
def test_a_reload_that_cannot_be_is_refused_saying_why(
    header: dict[str, str], version: int | None, remote: bool, needle: str
) -> None:
    control = Control(_config(), admins=None, remote_workers=remote)
    refusal = control.reload(header, None, version)
    assert isinstance(refusal, Refusal) and needle in refusal.message
    assert control.reloads == 0 and control.take_reload() is None
