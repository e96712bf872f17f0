"""The commands about the model directories of this machine, which need no server and no
TensorFlow: ``bertserve manifest`` writes or checks a directory's sha256 manifest, and
``bertserve models`` lists the models found here (:mod:`..model.found`), one a line as
``NAME  TASK  PATH`` in aligned columns, or with ``--json`` one JSON list; with ``--path
NAME`` it prints the directory of the model NAME alone, for a shell's
``MINILM=$(bertserve models --path all-MiniLM-L6-v2)``. It reads the models' JSON files
only, so it answers at once."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from bertserve.client.cli import HelpFormatter
from bertserve.client.terminal import print_status

from ..errors import BertServeError
from ..model.default import DEFAULT_MODEL_INSTALL
from ..model.found import INSTALLS, FoundModel, find_models


def add_model_dir_commands(commands: Any) -> None:
    """``bertserve manifest DIR [--check]`` and ``bertserve models [DIR ...] [--json | --path
    NAME]`` on an ``add_subparsers()`` object."""
    manifest = commands.add_parser(
        "manifest",
        help="write DIR/bertserve.sha256 (sha256 of every model file), or --check a copy against it",
        formatter_class=HelpFormatter,
    )
    manifest.add_argument("directory", help="a model directory")
    manifest.add_argument("--check", action="store_true", help="check the files against the manifest instead")
    manifest.set_defaults(run=_cmd_manifest)

    models = commands.add_parser(
        "models",
        help="list the models found on this machine: their names, tasks and directories",
        usage="%(prog)s [DIR ...] [--json | --path NAME]",
        description="The models bertserve finds here: the default model and the other models packages ship, "
        "the Hugging Face cache's, and those in each DIR given. One a line: NAME, TASK and PATH, for "
        "--model NAME=PATH (or --model-id NAME for a model of the Hugging Face cache).",
        formatter_class=HelpFormatter,
    )
    models.add_argument(
        "directories",
        nargs="*",
        metavar="DIR",
        help="a folder of model directories, as --models-dir takes (or one model's directory)",
    )
    output = models.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="write one JSON list of the models, with their families")
    output.add_argument(
        "--path",
        metavar="NAME",
        help="print only the directory of the model NAME, as in MINILM=$(bertserve models --path all-MiniLM-L6-v2)",
    )
    models.set_defaults(run=_cmd_models)


def _cmd_manifest(args: argparse.Namespace) -> int:
    from ..model.checksum import manifest_problems, write_manifest

    if not os.path.isdir(args.directory):
        raise BertServeError(f"{args.directory} is not a directory")
    if not args.check:
        path, count = write_manifest(args.directory)
        print(f"wrote {path}: {count} files", file=sys.stderr)
        return 0
    try:
        problems = manifest_problems(args.directory)
    except FileNotFoundError:
        raise BertServeError(f"{args.directory} has no manifest: write one with `bertserve manifest DIR`") from None
    for problem in problems:
        print_status("error", problem)
    if not problems:
        print(f"{args.directory}: every file matches its manifest", file=sys.stderr)
    return 1 if problems else 0


def _cmd_models(args: argparse.Namespace) -> int:
    found = find_models(args.directories)
    if args.path is not None:
        print(model_path(found, args.path))
        return 0
    whole = [model for model in found if not model.note]
    if args.json:
        print(json.dumps([model.as_json() for model in found], indent=2))
    else:
        print(models_table(whole), end="")
        for model in found:
            if model.note:
                print_status("warning", f"{model.name} ({model.path}) is not listed: {model.note}")
    if not found:
        print_status(
            "warning",
            f"no model found: install the default one with `{DEFAULT_MODEL_INSTALL}`, "
            "or name a folder of model directories: bertserve models DIR",
        )
    return 0


def models_table(models: list[FoundModel]) -> str:
    """``NAME  TASK  PATH``, one model a line, the columns aligned."""
    if not models:
        return ""
    name_width = max(len(model.name) for model in models)
    task_width = max(len(model.task) for model in models)
    return "".join(f"{m.name:<{name_width}}  {m.task:<{task_width}}  {m.path}\n" for m in models)


def model_path(found: list[FoundModel], name: str) -> str:
    """The directory of the first model of ``found`` named ``name``. Raises
    :class:`BertServeError` when none is, or when it cannot be served as it is (its note says
    why), naming the models that are there and, for a model a package ships, its install."""
    model = next((model for model in found if model.name == name), None)
    if model is not None and not model.note:
        return model.path
    if model is not None:
        raise BertServeError(f"{name} ({model.path}) cannot be served yet: {model.note}")
    whole = [model.name for model in found if not model.note]
    listed = f"; the models found: {', '.join(whole)}" if whole else ", nor any other"
    install = f"; install it with `{INSTALLS[name]}`" if name in INSTALLS else ""
    raise BertServeError(f"no model named {name} is found here{listed}{install}")
