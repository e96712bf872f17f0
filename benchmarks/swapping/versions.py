"""A model version written into a repository as a deployment writes it: aside, then renamed
into place, with a manifest; optionally "fine-tuned" so that its vectors tell it apart."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from bertserve.server.model.checksum import write_manifest


def write_version(source: Path, target: Path, *, scale: float | None = None) -> None:
    """Copy ``source`` to ``target`` (its last LayerNorm scaled by ``scale``) with a manifest;
    written aside and renamed into place, as a deployment would."""
    staging = target.with_name(f".{target.name}.partial")
    shutil.copytree(source, staging)
    if scale is not None:
        from safetensors.numpy import load_file, save_file

        path = staging / "model.safetensors"
        weights = load_file(str(path))
        name = next(k for k in sorted(weights) if k.endswith("output.LayerNorm.weight") and ".5." in k)
        weights[name] = (weights[name] * scale).astype(weights[name].dtype)
        save_file(weights, str(path), metadata={"format": "pt"})
    write_manifest(str(staging))
    past = time.time() - 60  # written a minute ago: nothing waits for it to settle
    for path in staging.rglob("*"):
        os.utime(path, (past, past))
    staging.rename(target)
