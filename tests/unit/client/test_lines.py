"""``bertserve encode``'s input, line by line, and the client's ``pairs`` option, without a
server: blank and empty input, line numbers, what a sentence pair is, and the advice its
messages give. ``tests/integration/test_cli_encode_lines.py`` runs the command on a server."""

from __future__ import annotations

import io
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from bertserve.client.advice import PYTHON
from bertserve.client.commands import CLI_ADVICE
from bertserve.client.core.handshake import check_server
from bertserve.client.core.options import EncodeOptions
from bertserve.client.core.requests import length_warning
from bertserve.client.errors import NoServerError
from bertserve.client.lines import (
    all_lines,
    empty_sided_pair,
    long_pairs,
    numbered,
    pair_lines,
    read_lines,
    save,
    some_lines,
)
from bertserve.client.protocol import check_texts, one_sentence


def test_lines_end_at_newlines_only(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes("\ufeffone\r\ntwo\x0cstill two\n\n  \nthree\u2028same line".encode())
    assert read_lines(str(source), keep_blank=True) == ["one", "two\x0cstill two", "", "  ", "three\u2028same line"]
    assert read_lines(str(source)) == ["one", "two\x0cstill two", "three\u2028same line"]  # bertserve embed's
    source.write_bytes(b"caf\xe9\n")
    with pytest.raises(ValueError, match=rf"^{source} is not UTF-8 text: invalid continuation byte at byte 3$"):
        read_lines(str(source))


def test_stdin_is_read_as_utf8_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    class Stdin(io.StringIO):
        buffer = io.BytesIO("été\ndeux ||| trois\n".encode())

    monkeypatch.setattr(sys, "stdin", Stdin())
    assert read_lines("-", keep_blank=True) == ["été", "deux ||| trois"]


def test_blank_and_empty_input_are_errors_that_name_the_lines() -> None:
    with pytest.raises(ValueError, match=r"^no input: stdin is empty"):
        numbered([], "stdin", skip_blank=False)
    with pytest.raises(
        ValueError,
        match=r"^line 2 of in.txt is blank, and each line must become one vector: "
        r"pass --skip-blank",
    ):
        numbered(["a", " ", "b"], "in.txt", skip_blank=False)
    with pytest.raises(ValueError, match=r"^lines 1, 2, 3, 4, 5 and 2 more of in.txt are blank"):
        numbered([""] * 7 + ["a"], "in.txt", skip_blank=False)
    with pytest.raises(ValueError, match=r"^no input: every line of in.txt is blank"):
        numbered(["", "\t"], "in.txt", skip_blank=True)
    lines = numbered(["a", "", "b", "", "", "c"], "in.txt", skip_blank=True)
    assert (lines.texts, lines.numbers, lines.skipped) == (["a", "b", "c"], [1, 3, 6], [2, 4, 5])


def test_line_numbers_are_written_for_people() -> None:
    assert some_lines([4]) == "line 4"
    assert some_lines([4, 9]) == "lines 4 and 9"
    assert all_lines([2]) == "line 2"
    assert all_lines([2, 3, 4]) == "lines 2-4"
    assert all_lines([2, 5, 6, 7, 8, 9, 14]) == "lines 2, 5-9 and 14"


def test_sentence_pairs_are_found_by_what_the_server_cuts() -> None:
    lines = numbered(["plain", "a ||| b", "x|||y", "left ||| ", "a | | b"], "in", skip_blank=False)
    assert pair_lines(lines, is_tokenized=False) == [2, 3, 4]
    assert empty_sided_pair(lines, is_tokenized=False) == "line 4 is a sentence pair with an empty side: 'left ||| '"
    tokens = numbered(["a ||| b", "x|||y", "||| b"], "in", skip_blank=False)
    assert pair_lines(tokens, is_tokenized=True) == [1, 3]  # a token "|||", not a word holding it
    assert empty_sided_pair(tokens, is_tokenized=True) == "line 3 is a sentence pair with an empty side: '||| b'"
    long = numbered(["w " * 20 + "||| " + "v " * 10, "w " * 40, "w " * 6 + "||| v"], "in", skip_blank=False)
    assert long_pairs(long, max_seq_len=32, is_tokenized=False) == [1]  # 30 words + [CLS] and two [SEP]: 33
    assert long_pairs(long, max_seq_len=32, is_tokenized=True) == [1]


def test_without_pairs_the_server_sees_one_sentence_of_the_same_tokens() -> None:
    assert check_texts(["a ||| b", "plain", "x||||y"], pairs=False) == ["a | | | b", "plain", "x| | | |y"]
    assert check_texts([["a", "|||", "b"]], is_tokenized=True, pairs=False) == [["a", "|", "|", "|", "b"]]
    assert check_texts(["left ||| "], pairs=False) == ["left | | | "]  # no pair, so no empty side
    assert check_texts(["a ||| b"]) == ["a ||| b"]  # the Python API's default: a pair
    for text in ("|||", "a|||||b", "|| ||| ||||"):
        assert "|||" not in one_sentence(text)
        assert one_sentence(text).replace(" ", "") == text.replace(" ", "")
    assert EncodeOptions(pairs=False).check_texts(("a ||| b",)) == ["a | | | b"]
    with pytest.raises(TypeError, match="pairs must be True or False"):
        EncodeOptions(pairs=None)  # type: ignore[arg-type]


def test_bert_tokenization_is_the_same_with_the_pipes_spaced() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    pre = tokenizers.pre_tokenizers.BertPreTokenizer()
    for text in ("a ||| b", "x|||||y", "end |||", "||| start"):
        words = [word for word, _ in pre.pre_tokenize_str(text)]
        assert [word for word, _ in pre.pre_tokenize_str(one_sentence(text))] == words


def test_messages_name_the_python_options_or_the_flags() -> None:
    config = {"max_seq_len": 4, "server_version": "0.0.1", "protocol": 1}
    texts = ["short", "one two three four five"]
    assert length_warning(config, texts, False) == (
        "texts[1] has 5 words, more than the server's max_seq_len=4 tokens: it and any other long text will be "
        "truncated; pass long_inputs='chunk' to encode it in windows, start the server with a larger max_seq_len, "
        "or pass check_length=False to silence this"
    )
    cli = length_warning(config, texts, False, replace(CLI_ADVICE, line_numbers=[1, 3]))
    assert cli == (
        "line 3 has 5 words, more than the server's max_seq_len=4 tokens: it and any other long line will be "
        "truncated; pass --long-inputs chunk to encode it in windows, start the server with a larger --max-seq-len, "
        "or pass --long-inputs truncate to silence this"
    )
    for advice, silence in ((PYTHON, "; pass check_version=False to silence this"), (CLI_ADVICE, "")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_server(config, "tcp://h:1", stacklevel=1, advice=advice)
        assert str(caught[0].message).endswith(f"runs bertserve 0.0.1, this client {_version()}{silence}")
    error = NoServerError("tcp://h:1", port_out=2, timeout_ms=50, refused=False)
    assert str(error).endswith("or pass its host= and port= if it runs elsewhere")
    assert error.advise(CLI_ADVICE).endswith("or pass its --host and --port if it runs elsewhere")


def _version() -> str:
    from bertserve.client import __version__

    return __version__


def test_npz_output_keeps_the_line_numbers(tmp_path: Path) -> None:
    vectors = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert save(str(tmp_path / "v.npz"), vectors, [1, 3]) == str(tmp_path / "v.npz")
    with np.load(tmp_path / "v.npz") as data:
        np.testing.assert_array_equal(data["vectors"], vectors)
        assert data["lines"].tolist() == [1, 3]
    assert save(str(tmp_path / "v"), vectors, [1, 3]) == str(tmp_path / "v.npy")  # as numpy names it
    np.testing.assert_array_equal(np.load(tmp_path / "v.npy"), vectors)
