"""The HTTP API's key file (``--api-keys``), its principals, and the body budget."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from bertserve.server.cli.main import build_parser, server_config_from_args
from bertserve.server.config.server import HTTP_BODY_BYTES, HTTP_BODY_BYTES_TOTAL, ServerConfig
from bertserve.server.errors import ConfigError
from bertserve.server.http.bodies import ARRAY_COST, COMMA_COST, OBJECT_COST, BodyBudget, parse_cost
from bertserve.server.http.principals import (
    SINGLE_KEY_NAME,
    KeyFileError,
    Principal,
    Principals,
    load_principals,
    parse_key_file,
    read_key_file,
)
from bertserve.server.testing.config import server_config

ALICE_KEY = "alice-key-0123456789"
BOB_KEY = "bob:key/with+odd=chars~"


def write_private(path: Path, data: str | bytes) -> None:
    """A key file as its owner keeps one: read and written by the owner only."""
    path.touch(mode=0o600)
    path.write_bytes(data.encode() if isinstance(data, str) else data)


def test_a_key_file_names_one_principal_a_line() -> None:
    text = f"# who may call\n\n  alice   {ALICE_KEY}  \nbatch.etl_2\t{BOB_KEY}\n   # indented comment\n"
    principals = Principals(parse_key_file(text, "keys.txt"))
    assert principals.names == ("alice", "batch.etl_2") and principals.required
    assert principals.authenticate(ALICE_KEY.encode()) == "alice"
    assert principals.authenticate(BOB_KEY.encode()) == "batch.etl_2"
    for wrong in (b"", ALICE_KEY[:-1].encode(), ALICE_KEY.encode() + b"x", b"alice"):
        assert principals.authenticate(wrong) is None
    assert ALICE_KEY not in repr(principals) and ALICE_KEY not in repr(parse_key_file(text, "k"))
    assert not Principals().required and Principals().authenticate(b"anything") is None


@pytest.mark.parametrize(
    ("text", "line", "problem"),
    [
        (f"alice {ALICE_KEY} extra", 1, "expected NAME KEY"),
        ("# only a comment\nalice\n", 2, "expected NAME KEY"),
        (f"al ice {ALICE_KEY}", 1, "expected NAME KEY"),
        (f"-alice {ALICE_KEY}", 1, "a name is 1 to 64"),
        (f"{'a' * 65} {ALICE_KEY}", 1, "a name is 1 to 64"),
        (f"al/ice {ALICE_KEY}", 1, "a name is 1 to 64"),
        ("alice short-7", 1, "shorter than 8"),
        (f"alice {'k' * 513}", 1, "longer than 512"),
        ("alice clé-0123456789", 1, "not visible ASCII"),
        (f"alice {ALICE_KEY}\n\nalice {BOB_KEY}", 3, "'alice' is taken already, on line 1"),
        (f"alice {ALICE_KEY}\nbob {ALICE_KEY}", 2, "'bob' has the same key as 'alice' on line 1"),
    ],
)
def test_a_bad_line_names_the_file_and_line_and_never_the_key(text: str, line: int, problem: str) -> None:
    with pytest.raises(KeyFileError) as caught:
        parse_key_file(text, "/etc/keys.txt")
    message = str(caught.value)
    assert message.startswith(f"/etc/keys.txt, line {line}: ") and problem in message, message
    for key in (ALICE_KEY, BOB_KEY, "short-7", "clé-0123456789", "k" * 100):
        assert key not in message


def test_an_empty_unreadable_or_binary_file_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    write_private(empty, "# nobody yet\n\n")
    with pytest.raises(KeyFileError, match="holds no key"):
        read_key_file(str(empty))
    with pytest.raises(KeyFileError, match="cannot read the API key file"):
        read_key_file(str(tmp_path / "missing"))
    binary = tmp_path / "binary"
    write_private(binary, b"alice \xff\xfe-0123456789\n")
    with pytest.raises(KeyFileError, match="not UTF-8"):
        read_key_file(str(binary))


def test_a_key_file_group_or_others_may_read_or_change_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    write_private(path, f"alice {ALICE_KEY}\n")
    os.chmod(path, 0o600)
    assert read_key_file(str(path))
    for mode in (0o640, 0o620, 0o604, 0o602, 0o644):
        os.chmod(path, mode)
        with pytest.raises(KeyFileError, match=f"chmod 600 {path}") as refused:
            read_key_file(str(path))
        assert f"mode {mode:o}" in str(refused.value) and ALICE_KEY not in str(refused.value)


def test_the_single_api_key_is_the_principal_named_default(tmp_path: Path) -> None:
    single = load_principals("single-key-0123", None)
    assert single.names == (SINGLE_KEY_NAME,) and single.authenticate(b"single-key-0123") == SINGLE_KEY_NAME
    path = tmp_path / "keys"
    write_private(path, f"alice {ALICE_KEY}\n")
    both = load_principals("single-key-0123", str(path))
    assert both.names == ("alice", SINGLE_KEY_NAME)
    assert both.authenticate(ALICE_KEY.encode()) == "alice"
    with pytest.raises(KeyFileError, match="--api-key is also a key in"):
        load_principals(ALICE_KEY, str(path))
    write_private(path, f"default {ALICE_KEY}\n")
    with pytest.raises(KeyFileError, match="'default', the name of --api-key"):
        load_principals("single-key-0123", str(path))
    assert not load_principals(None, None).required


def test_principals_keep_only_digests_and_refuse_duplicates() -> None:
    alice = Principal.of("alice", ALICE_KEY)
    assert ALICE_KEY.encode() not in alice.digest and len(alice.digest) == 32
    with pytest.raises(ConfigError):
        Principals([alice, Principal.of("alice", BOB_KEY)])
    with pytest.raises(ConfigError):
        Principals([alice, Principal.of("bob", ALICE_KEY)])


# -- the flags and the config -------------------------------------------------------------


def _config(argv: list[str]) -> ServerConfig:
    return server_config_from_args(build_parser().parse_args(["start", "--model-dir", "/m", *argv]))


def test_the_http_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(["--http-port", "8080"])
    assert config.security.api_keys is None and config.http.max_http_body_bytes_total == HTTP_BODY_BYTES_TOTAL
    assert config.http_body_limit == HTTP_BODY_BYTES
    config = _config(
        ["--api-keys", "/etc/keys", "--max-http-body-bytes", "4096", "--max-http-body-bytes-total", "8192"]
    )
    assert (config.security.api_keys, config.http_body_limit, config.http.max_http_body_bytes_total) == (
        "/etc/keys",
        4096,
        8192,
    )
    assert config.public()["api_keys"] == "(set)"
    monkeypatch.setenv("BERTSERVE_API_KEYS", "/run/secrets/keys")
    assert _config([]).security.api_keys == "/run/secrets/keys"
    # a small frame limit or budget bounds the default body limit too
    assert _config(["--max-message-bytes", "2048"]).http_body_limit == 2048
    assert _config(["--max-http-body-bytes-total", "4096"]).http_body_limit == 4096
    under_curve = _config(["--http-port", "8080", "--curve-dir", "/keys", "--api-keys", "/etc/keys"])
    assert under_curve.security.curve_dir == "/keys"


@pytest.mark.parametrize(
    ("options", "problem"),
    [
        ({"max_http_body_bytes": 100}, "between 1024 and the request frame limit"),
        ({"max_http_body_bytes": 2**20, "max_message_bytes": 4096}, "between 1024 and the request frame limit"),
        ({"max_http_body_bytes": 2**20, "max_http_body_bytes_total": 2**19}, "must not exceed"),
        ({"max_http_body_bytes_total": 10}, "at least 1024"),
    ],
)
def test_bad_body_limits_are_refused(options: dict[str, int], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        server_config("/m", **options)  # type: ignore[arg-type]


def test_an_api_key_on_the_command_line_is_warned_of(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from bertserve.server.cli import main as cli

    monkeypatch.setattr(cli, "_serve", lambda config, args: 0)
    monkeypatch.delenv("BERTSERVE_API_KEY", raising=False)
    assert cli.main(["start", "--model-dir", "/m", "--api-key", "from-argv-0123"]) == 0
    err = capsys.readouterr().err
    assert "visible to every user" in err and "from-argv-0123" not in err
    monkeypatch.setenv("BERTSERVE_API_KEY", "from-env-0123")
    assert cli.main(["start", "--model-dir", "/m"]) == 0
    assert "visible to every user" not in capsys.readouterr().err


# -- the body budget ------------------------------------------------------------------------


def test_a_body_costs_its_bytes_its_commas_and_brackets() -> None:
    assert parse_cost(b'"no commas here"') == 0
    assert parse_cost(b'{"input": "no commas here"}') == OBJECT_COST
    assert parse_cost(b'["ab","cd","ef"]') == 2 * COMMA_COST + ARRAY_COST
    assert parse_cost(b'[{"0":[]}]') == OBJECT_COST + 2 * ARRAY_COST
    budget = BodyBudget(1000)
    assert budget.take(600) and not budget.take(401) and budget.in_use == 600
    assert budget.take(400) and budget.in_use == 1000 and not budget.take(1)
    budget.give(1000)
    assert budget.in_use == 0 and budget.take(1000)
