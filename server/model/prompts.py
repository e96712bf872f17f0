"""Prompts: named texts put before each input, as sentence-transformers does.

A model directory may name its prompts in ``config_sentence_transformers.json``::

    {"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "query"}

and the server adds its own with ``--prompt NAME=TEXT`` (over the directory's of the same
name) and picks the default with ``--default-prompt-name NAME``. A request names a prompt
(``prompt_name``) or gets the default one, if any. Pure: files are read once, at start.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ModelFileError, ModelOptionError
from .json_file import read_json
from .st_modules import pooling_config

ST_CONFIG = "config_sentence_transformers.json"


class UnknownPrompt(ValueError):
    """A request names a prompt the server does not have."""


@dataclass(frozen=True)
class Prompts:
    """The prompts a server offers, by name, and the one a request gets when it names none."""

    texts: dict[str, str] = field(default_factory=dict)
    default: str | None = None
    # a model's LoRA task adapters (jina-embeddings-v3's), each chosen by the prompt of its name
    adapters: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.default is not None and self.default not in self.texts:
            raise ValueError(f"the default prompt {self.default!r} is not one of the prompts")

    def text_of(self, name: str | None) -> str:
        """The text of prompt ``name``; with None, the default's (``""`` when there is none)."""
        if name is None:
            return "" if self.default is None else self.texts[self.default]
        if name in self.texts:
            return self.texts[name]
        if not self.texts:
            raise UnknownPrompt(
                f"unknown prompt_name {name!r}: this server has no prompts "
                "(start it with --prompt NAME=TEXT to add one)"
            )
        known = ", ".join(repr(known) for known in sorted(self.texts))
        raise UnknownPrompt(f"unknown prompt_name {name!r}: this server's prompts are {known}")

    def adapter_of(self, name: str | None) -> int:
        """The adapter that prompt ``name`` (None: the default's) chooses: its place in the
        model's adapters plus one, or 0 for none (a prompt named like no adapter)."""
        name = self.default if name is None else name
        return self.adapters.index(name) + 1 if name in self.adapters else 0

    def describe(self) -> dict[str, Any]:
        """The prompts and the default's name, as the server reports them."""
        return {"prompts": dict(self.texts), "default_prompt_name": self.default}


def apply_prompt(texts: list[str], prompt: str) -> list[str]:
    """``texts`` with ``prompt`` before each, as sentence-transformers does (a pair
    ``"a ||| b"`` gets it before its first side); ``""`` leaves them as they are."""
    if not prompt:
        return list(texts)
    return [prompt + text for text in texts]


def resolve_prompts(model_dir: str, flags: Sequence[str], default_name: str | None) -> Prompts:
    """The prompts of ``model_dir`` with those of ``flags`` (``NAME=TEXT``) over them, and the
    default: ``default_name`` when given, else the directory's."""
    config_path = os.path.join(model_dir, ST_CONFIG)
    texts, dir_default = _read_st_prompts(config_path) if os.path.isfile(config_path) else ({}, None)
    texts = {**texts, **_parse_flags(flags)}
    if default_name is not None:
        if default_name not in texts:
            raise ModelOptionError(f"--default-prompt-name {default_name!r} is not a prompt: {_known(texts)}")
        default = default_name
    elif dir_default is not None:
        if dir_default not in texts:
            raise ModelFileError(
                f"{config_path}: default_prompt_name {dir_default!r} is not one of its prompts: {_known(texts)}; "
                "add it with --prompt NAME=TEXT or choose another with --default-prompt-name"
            )
        default = dir_default
    else:
        default = None
    if any(texts.values()):
        _check_pooling_takes_prompts(model_dir)
    return Prompts(texts=texts, default=default)


def _read_st_prompts(path: str) -> tuple[dict[str, str], str | None]:
    raw = read_json(path)
    prompts = raw.get("prompts", {})
    if prompts is None:
        prompts = {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise ModelFileError(f'{path}: "prompts" should be an object of names to texts, not {prompts!r}')
    default = raw.get("default_prompt_name")
    if default is not None and not isinstance(default, str):
        raise ModelFileError(f'{path}: "default_prompt_name" should be a string or null, not {default!r}')
    return dict(prompts), default


def _parse_flags(flags: Sequence[str]) -> dict[str, str]:
    texts: dict[str, str] = {}
    for flag in flags:
        name, equals, text = str(flag).partition("=")
        name = name.strip()
        if not equals or not name:
            raise ModelOptionError(f"--prompt takes NAME=TEXT (such as 'query=query: '), not {flag!r}")
        if name in texts:
            raise ModelOptionError(f"--prompt names {name!r} twice")
        texts[name] = text
    return texts


def _check_pooling_takes_prompts(model_dir: str) -> None:
    found = pooling_config(model_dir)
    if found is None:
        return
    path, raw = found
    if raw.get("include_prompt", True) is False:
        raise ModelOptionError(
            f"{path} sets include_prompt to false: sentence-transformers leaves a prompt's tokens out of "
            "this model's pooling, which bertserve does not do, so its vectors would differ. Serve it without "
            "prompts (no --prompt, and no prompts in " + ST_CONFIG + ")"
        )


def _known(texts: dict[str, str]) -> str:
    return "the prompts are " + ", ".join(map(repr, sorted(texts))) if texts else "there are no prompts"
