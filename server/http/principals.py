"""Who calls the HTTP API: API keys, each held by a named principal.

A principal is what the server's per-client bounds, fair turns and per-caller metrics apply
to over HTTP. With keys, each key is one principal, named in the key file; the request's
``user`` field (OpenAI's) never is one, so a key holder can neither widen its share by
varying it nor eat into another principal's by naming it. Without keys, each peer address is
a principal (a proxy in front makes all its callers one).

``--api-keys FILE`` holds one principal a line, its name and its key apart by spaces or
tabs; blank lines and lines starting with ``#`` are skipped::

    # name    key
    alice     3f0c9e1d6b7a4f25a1c8e0b9d2f4a6c8
    batch-etl 9b8a7c6d5e4f30211f2e3d4c5b6a7988

A name is 1 to 64 of ``[A-Za-z0-9._-]``, starting with a letter or digit, and unique; a key
is 8 to 512 visible ASCII characters (no spaces), and unique. ``--api-key KEY`` (better:
``BERTSERVE_API_KEY``) is one more principal, named :data:`SINGLE_KEY_NAME`. A file that
breaks a rule stops the start with :class:`KeyFileError`, naming the file and the line, and
never the key. Keys are compared in constant time, against every key each time.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, ConfigDict, StringConstraints, ValidationError

from ..errors import ConfigError

logger = logging.getLogger("bertserve.http")

SINGLE_KEY_NAME = "default"
"""The principal name of ``--api-key`` (``BERTSERVE_API_KEY``)."""

MIN_KEY_CHARS = 8
MAX_KEY_CHARS = 512
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_KEY_PATTERN = r"^[\x21-\x7e]+$"  # visible ASCII: what a Bearer token may hold, and no spaces


class KeyFileError(ConfigError):
    """An ``--api-keys`` file cannot be used; the message names the file and line, never a key."""


class _Line(BaseModel):
    """The declared schema of one line of a key file."""

    model_config = ConfigDict(strict=True, frozen=True, hide_input_in_errors=True)

    name: Annotated[str, StringConstraints(pattern=_NAME_PATTERN)]
    key: Annotated[str, StringConstraints(min_length=MIN_KEY_CHARS, max_length=MAX_KEY_CHARS, pattern=_KEY_PATTERN)]


@dataclass(frozen=True)
class Principal:
    """One API key, held as its SHA-256 digest, and the name it is known by."""

    name: str
    digest: bytes = field(repr=False)

    @classmethod
    def of(cls, name: str, key: str | bytes) -> Principal:
        return cls(name, _digest(key.encode() if isinstance(key, str) else key))


class Principals:
    """The principals an HTTP request may authenticate as; none: no key is needed."""

    def __init__(self, principals: Iterable[Principal] = ()) -> None:
        self._all = tuple(principals)
        names = [p.name for p in self._all]
        if len(set(names)) != len(names) or len({p.digest for p in self._all}) != len(self._all):
            raise ConfigError("every API key principal needs its own name and its own key")

    @property
    def required(self) -> bool:
        """Whether a request needs a key."""
        return bool(self._all)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self._all)

    def authenticate(self, token: bytes) -> str | None:
        """The name of the principal whose key ``token`` is, or None. The token's digest is
        compared with every key's, in constant time, so the time taken says neither whether nor
        which key matched, nor how long the keys are."""
        digest = _digest(token)
        found = None
        for principal in self._all:
            if hmac.compare_digest(digest, principal.digest):
                found = principal.name
        return found

    def __repr__(self) -> str:
        return f"Principals({', '.join(self.names) or 'none'})"


def parse_key_file(text: str, path: str) -> list[Principal]:
    """The principals of a key file's ``text``; :class:`KeyFileError` at the first bad line."""
    principals: list[Principal] = []
    name_lines: dict[str, int] = {}
    key_lines: dict[str, tuple[str, int]] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}, line {number}"
        fields = line.split()
        if len(fields) != 2:
            raise KeyFileError(f"{where}: expected NAME KEY (two fields apart by spaces), found {len(fields)} fields")
        try:
            entry = _Line(name=fields[0], key=fields[1])
        except ValidationError as exc:
            raise KeyFileError(f"{where}: {_problem(exc)}") from None
        if entry.name in name_lines:
            raise KeyFileError(f"{where}: the name {entry.name!r} is taken already, on line {name_lines[entry.name]}")
        if entry.key in key_lines:
            other, line_no = key_lines[entry.key]
            raise KeyFileError(
                f"{where}: {entry.name!r} has the same key as {other!r} on line {line_no}; "
                "every principal needs its own key"
            )
        name_lines[entry.name] = number
        key_lines[entry.key] = (entry.name, number)
        principals.append(Principal.of(entry.name, entry.key))
    if not principals:
        raise KeyFileError(f"{path} holds no key: write one NAME KEY line per principal")
    return principals


def read_key_file(path: str) -> list[Principal]:
    """The principals of the key file at ``path``; warns if other users may read it."""
    try:
        with open(path, encoding="utf-8") as file:
            mode = os.fstat(file.fileno()).st_mode
            text = file.read()
    except UnicodeDecodeError:
        raise KeyFileError(f"{path} is not UTF-8 text") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read the API key file {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):  # a local user could read a key, or add one of their own
        raise KeyFileError(
            f"the API key file {path} may be read or changed by group or other users "
            f"(mode {stat.S_IMODE(mode):o}): chmod 600 {path}"
        )
    return parse_key_file(text, path)


def load_principals(api_key: str | None, api_keys_file: str | None) -> Principals:
    """Who may call the HTTP API: the principals of ``api_keys_file``, and ``api_key`` as
    :data:`SINGLE_KEY_NAME`. Neither: anyone (each peer address a principal)."""
    principals = read_key_file(api_keys_file) if api_keys_file is not None else []
    if api_key is not None:
        single = Principal.of(SINGLE_KEY_NAME, api_key.strip())
        if any(p.name == SINGLE_KEY_NAME for p in principals):
            raise KeyFileError(
                f"{api_keys_file} names a principal {SINGLE_KEY_NAME!r}, the name of --api-key: "
                "rename it, or move --api-key into the file"
            )
        if any(p.digest == single.digest for p in principals):
            raise KeyFileError(f"--api-key is also a key in {api_keys_file}: every principal needs its own key")
        principals.append(single)
    return Principals(principals)


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


_KEY_PROBLEMS = {
    "string_too_short": f"the key is shorter than {MIN_KEY_CHARS} characters",
    "string_too_long": f"the key is longer than {MAX_KEY_CHARS} characters",
    "string_pattern_mismatch": "the key holds a character that is not visible ASCII",
}


def _problem(exc: ValidationError) -> str:
    """What is wrong with a line, without its key (pydantic's messages are not used as they are)."""
    first = exc.errors(include_url=False, include_input=False, include_context=False)[0]
    if first["loc"] and first["loc"][0] == "name":
        return "a name is 1 to 64 of A-Z a-z 0-9 . _ -, starting with a letter or a digit"
    return _KEY_PROBLEMS.get(first["type"], "the key is not valid")
