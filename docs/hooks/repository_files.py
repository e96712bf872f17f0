"""Brings the repository's files that the pages link to into the site.

The pages link to the benchmark reports and plots and to the Docker guide by their paths in
the repository (``../benchmarks/report/compare.md``), so the links work where the Markdown is
read as it is, on GitHub for one. This hook adds those files to the site under
``repository/`` and lets MkDocs resolve the same links to them, so they work in the site too,
and ``mkdocs build --strict`` still fails on a link to a file that does not exist.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files, InclusionLevel

# What the pages link to, relative to the repository's root.
_LINKED = (
    "benchmarks/README.md",
    "benchmarks/report/*.md",
    "benchmarks/report/*.png",
    "docker/README.md",
)


def on_files(files: Files, config: Any) -> Files:
    docs_dir = Path(config["docs_dir"])
    root = docs_dir.parent
    for pattern in _LINKED:
        for path in sorted(root.glob(pattern)):
            relative = path.relative_to(root).as_posix()
            # Where it lands in the site, worked out as for a page of docs/repository/.
            placed = File(f"repository/{relative}", str(docs_dir), config["site_dir"], config["use_directory_urls"])
            files.append(
                File(
                    f"../{relative}",  # the path a page's link resolves to, from docs/
                    str(docs_dir),
                    config["site_dir"],
                    config["use_directory_urls"],
                    dest_uri=placed.dest_uri,
                    inclusion=InclusionLevel.NOT_IN_NAV,
                )
            )
    return files
