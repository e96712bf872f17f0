"""``bertserve encode`` keeps its promise of one vector per line, on the real server: blank
lines and empty input are errors naming what is wrong, ``--skip-blank`` says what it skipped
(and a ``.npz`` keeps each row's line number), a ``|||`` makes a sentence pair only with
``--pairs``, ``--long-inputs`` reaches the server, and the warnings name the command's flags."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from bertserve.client import BertClient
from bertserve.server.testing.launcher import RunningServer

pytestmark = pytest.mark.timeout(300)

Main = Callable[..., subprocess.CompletedProcess[str]]

LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 6)  # 54 words, over max_seq_len=32


@pytest.fixture
def encode(tiny_server: RunningServer, bertserve_main: Main) -> Main:
    """``bertserve encode ARGS`` against the session's tiny BERT, run by ``main`` in this process."""
    ports = ["--host", "127.0.0.1", "--port", str(tiny_server.port), "--port-out", str(tiny_server.port_out)]
    return lambda *args, stdin: bertserve_main("encode", *ports, *args, stdin=stdin)


@pytest.fixture(scope="module")
def client(tiny_server: RunningServer) -> Iterator[BertClient]:
    with BertClient(**tiny_server.client_kwargs, timeout=60_000, check_length=False) as bc:
        yield bc


def test_a_blank_line_is_an_error_unless_skipped_and_then_named(
    encode: Main, client: BertClient, tmp_path: Path
) -> None:
    out = tmp_path / "out.npy"
    stdin = "hello world\n\nthe lazy dog\n   \nthe fox\n"
    refused = encode("-o", str(out), stdin=stdin)
    assert refused.returncode == 1 and not out.exists()
    assert refused.stderr == (
        "bertserve: error: lines 2 and 4 of stdin are blank, and each line must become one vector: "
        "pass --skip-blank to leave blank lines out (stderr then names them)\n"
    )

    expected = client.encode(["hello world", "the lazy dog", "the fox"])
    skipped = encode("-o", str(out), "--skip-blank", stdin=stdin)
    assert skipped.returncode == 0, skipped.stderr
    np.testing.assert_allclose(np.load(out), expected, atol=1e-6)
    said, wrote = skipped.stderr.splitlines()
    assert said == (
        f"skipped blank lines 2 and 4 of stdin: the rows of {out} follow the other lines in order "
        "(NAME.npz would keep their line numbers)"
    )
    assert wrote.startswith(f"wrote 3 vectors of dimension 32 to {out} in ")
    assert re.fullmatch(r".* in (\d+ ms|\d+\.\d s) \([\d,]+ sentences/s\)", wrote), wrote  # never "0.0 s"

    keyed = tmp_path / "out.npz"
    with_numbers = encode("-o", str(keyed), "--skip-blank", stdin=stdin)
    assert with_numbers.returncode == 0, with_numbers.stderr
    assert f"skipped blank lines 2 and 4 of stdin: the lines array of {keyed} holds each row's line number" in (
        with_numbers.stderr
    )
    with np.load(keyed) as data:
        np.testing.assert_allclose(data["vectors"], expected, atol=1e-6)
        assert data["lines"].tolist() == [1, 3, 5]


def test_empty_input_is_an_error_and_writes_nothing(encode: Main, tmp_path: Path) -> None:
    out = tmp_path / "out.npy"
    for stdin, args, problem in (
        ("", (), "no input: stdin is empty; give one text a line"),
        ("\n \n", ("--skip-blank",), "no input: every line of stdin is blank"),
    ):
        done = encode("-o", str(out), *args, stdin=stdin)
        assert (done.returncode, done.stderr) == (1, f"bertserve: error: {problem}\n")
        assert not out.exists()


def test_one_vector_is_one_vector(encode: Main, tmp_path: Path) -> None:
    done = encode("-o", str(tmp_path / "one.npy"), stdin="hello\n")
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith(f"wrote 1 vector of dimension 32 to {tmp_path / 'one.npy'} in ")


def test_a_pair_only_with_pairs_and_never_in_silence(encode: Main, client: BertClient, tmp_path: Path) -> None:
    lines = ["the quick fox ||| the lazy dog", "hello world"]
    as_pairs, as_sentences = client.encode(lines), client.encode(lines, pairs=False)
    assert not np.allclose(as_pairs[0], as_sentences[0], atol=1e-4)
    np.testing.assert_allclose(as_pairs[1], as_sentences[1], atol=1e-6)
    _, tokens = client.encode(lines[:1], pairs=False, show_tokens=True)
    assert tokens[0].count("[SEP]") == 1 and tokens[0].count("|") == 3  # one sentence, its pipes and all

    out = tmp_path / "out.npy"
    plain = encode("-o", str(out), stdin="\n".join(lines) + "\n")
    assert plain.returncode == 0, plain.stderr
    np.testing.assert_allclose(np.load(out), as_sentences, atol=1e-6)
    warning = plain.stderr.splitlines()[0]
    assert warning == (
        "bertserve: warning: line 1 of stdin holds '|||', encoded as one sentence a line: "
        "pass --pairs to encode such lines as sentence pairs"
    )

    paired = encode("-o", str(out), "--pairs", stdin="\n".join(lines) + "\n")
    assert paired.returncode == 0, paired.stderr
    np.testing.assert_allclose(np.load(out), as_pairs, atol=1e-6)
    assert "warning" not in paired.stderr

    empty_side = encode("-o", str(tmp_path / "no.npy"), "--pairs", stdin="hello\nthe fox ||| \n")
    assert empty_side.returncode == 1 and not (tmp_path / "no.npy").exists()
    assert empty_side.stderr == (
        "bertserve: error: line 2 is a sentence pair with an empty side: 'the fox ||| ': "
        "write both sentences, or pass --no-pairs\n"
    )


def test_long_inputs_and_the_advice_in_flags(encode: Main, client: BertClient, tmp_path: Path) -> None:
    if client.server_config.get("long_inputs") == "chunk":
        pytest.skip("this server chunks long inputs by default")
    lines = ["hello world", LONG]
    out = tmp_path / "out.npy"
    stdin = "\n".join(lines) + "\n"

    truncated = encode("-o", str(out), stdin=stdin)
    assert truncated.returncode == 0, truncated.stderr
    np.testing.assert_allclose(np.load(out), client.encode(lines), atol=1e-6)
    assert truncated.stderr.splitlines()[0] == (
        "bertserve: warning: line 2 has 54 words, more than the server's max_seq_len=32 tokens: it and any other "
        "long line will be truncated; pass --long-inputs chunk to encode it in windows, start the server with a "
        "larger --max-seq-len, or pass --long-inputs truncate to silence this"
    )
    for python_words in ("long_inputs=", "check_length", "check_version", "texts["):
        assert python_words not in truncated.stderr

    chunked = encode("-o", str(out), "--long-inputs", "chunk", stdin=stdin)
    assert chunked.returncode == 0, chunked.stderr
    np.testing.assert_allclose(np.load(out), client.encode(lines, long_inputs="chunk"), atol=1e-5)
    assert not np.allclose(np.load(out)[1], client.encode(lines)[1], atol=1e-4)
    assert "warning" not in chunked.stderr

    quiet = encode("-o", str(out), "--long-inputs", "truncate", stdin=stdin)
    assert quiet.returncode == 0 and "warning" not in quiet.stderr

    pair = f"hello world ||| {LONG}"
    cut = encode("-o", str(out), "--pairs", "--long-inputs", "chunk", stdin=f"hello\n{pair}\n")
    assert cut.returncode == 0, cut.stderr
    assert cut.stderr.splitlines()[0] == (
        "bertserve: warning: line 2 is a sentence pair longer than the server's max_seq_len=32 tokens: "
        "--long-inputs chunk encodes single sentences in windows, never pairs, so it will be truncated"
    )
    np.testing.assert_allclose(np.load(out), client.encode(["hello", pair], long_inputs="chunk"), atol=1e-5)


def test_embed_in_process_keeps_one_vector_a_line_too(
    tiny_google: str, session_graph_dir: str, tmp_path: Path, bertserve_main: Main
) -> None:
    def embed(*args: str, stdin: str) -> subprocess.CompletedProcess[str]:
        model = ["--model-dir", tiny_google, "--graph-dir", session_graph_dir, "--max-seq-len", "32"]
        return bertserve_main("embed", *model, *args, stdin=stdin)

    out = tmp_path / "rows.npz"
    for stdin, error in [("a\n\nb\n", "line 2 of stdin is blank"), ("", "no input: stdin is empty")]:
        refused = embed("-o", str(out), stdin=stdin)
        assert refused.returncode == 2 and error in refused.stderr and not out.exists(), refused.stderr
    done = embed("-o", str(out), "--skip-blank", stdin="the fox ||| the dog\n\nthe lazy dog\n")
    assert done.returncode == 0, done.stderr
    assert "line 1 of stdin holds '|||', encoded as one sentence a line" in done.stderr
    assert "skipped blank line 2 of stdin" in done.stderr and f"wrote 2 vectors of dimension 32 to {out}" in done.stderr
    saved = np.load(out)
    assert saved["vectors"].shape == (2, 32) and saved["lines"].tolist() == [1, 3]
    paired = embed("-o", str(tmp_path / "pair.npy"), "--pairs", stdin="the fox ||| the dog\n")
    assert paired.returncode == 0 and "'|||'" not in paired.stderr, paired.stderr
    assert not np.allclose(
        np.load(tmp_path / "pair.npy")[0], saved["vectors"][0], atol=1e-4
    )  # a pair is not one sentence
