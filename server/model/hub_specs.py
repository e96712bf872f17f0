"""Models of the Hugging Face Hub named on the command line: ``--model-id ORG/NAME[@REVISION]``
and a ``--model`` whose directory is a Hub id (``bge=BAAI/bge-small-en-v1.5@main``), fetched
once, in the process that reads the command line, before any config is built from them: a
spec is written again with the model's directory in the Hub cache and
:data:`..config.model.HUB_FIELDS`, so every process after it reads a directory."""

from __future__ import annotations

from collections.abc import Sequence

from ..config.model import HUB_FIELDS
from ..config.specs import ModelSpec, parse_model_spec
from ..errors import ConfigError, ModelFileError
from .hub import HubModel, fetch_model, is_model_id


def hub_fields(model: HubModel) -> dict[str, str]:
    """The model config's fields of a model fetched from the Hub: its directory, id, revision and commit."""
    return {
        "model_dir": model.directory,
        "model_id": model.repo_id,
        "model_revision": model.revision,
        "model_commit": model.commit,
    }


def fetch_hub_model(model_id: str) -> dict[str, str]:
    """``--model-id``'s model fetched into the Hub cache: the model config's fields that say where and what it is."""
    return hub_fields(fetch_model(model_id))


def fetch_hub_models(specs: Sequence[str]) -> tuple[str, ...]:
    """The ``--model`` specs, each whose directory is a Hub id fetched into the Hub cache and
    written again with its directory there and what it is (:data:`..config.model.HUB_FIELDS`);
    the others as given. Raises :class:`..errors.HubError` naming the model that cannot be had."""
    written = []
    for text in specs:
        spec = parse_model_spec(text)
        if not is_model_id(spec.model_dir):
            written.append(text)
            continue
        given = [key for key, _ in spec.options if key in HUB_FIELDS]
        if given:
            raise ConfigError(f"--model {spec.name}: {given[0]} is what the Hub says, not an option")
        try:
            fields = hub_fields(fetch_model(spec.model_dir))
        except ModelFileError as exc:
            taken = f"no directory {spec.model_dir} exists, so it was taken for a Hub id, and "
            raise type(exc)(f"--model {spec.name}: {taken}{exc}") from exc
        if "," in fields["model_dir"]:
            raise ConfigError(
                f"--model {spec.name}: the Hub cache {fields['model_dir']} has a comma in its path, which --model "
                "cannot hold; set HF_HOME to a path without one"
            )
        options = (*((key, value) for key, value in fields.items() if key != "model_dir"), *spec.options)
        written.append(ModelSpec(spec.name, fields["model_dir"], options).written())
    return tuple(written)
