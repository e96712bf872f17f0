"""What the server side needs installed beyond the client, and the command that installs
what is missing.

The server commands (``start``, ``worker``, ``embed``, ``export``) call
:func:`missing_server_requirements` before anything else, so a client-only install
(``pip install .``) gets one line naming the missing packages instead of a traceback from
deep inside. It looks for each distribution's metadata (and, without it, for the package with
:func:`importlib.util.find_spec`), which imports nothing (TensorFlow takes seconds to
import). The list is setup.py's ``server`` extra: read from setup.py itself when bertserve
runs from a source checkout, else from the installed distribution's metadata.
:func:`install_command` says how to install them from where the user is:
``pip install -e 'CHECKOUT[server]'`` from a checkout (without ``-e`` when it was installed
from a directory without it), else the missing requirements themselves.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

DISTRIBUTION = "bertserve"
EXTRA = "server"
_CHECKOUT = Path(__file__).resolve().parent.parent  # the folder holding setup.py, in a source checkout


@dataclass(frozen=True)
class Requirement:
    name: str  # the distribution, as pip knows it: "prometheus-client"
    spec: str  # what to install: "prometheus-client>=0.17"

    @property
    def module(self) -> str:
        """The package it installs, as Python imports it, where its metadata is not found: its
        name with ``_`` for ``-``, but for those named otherwise (:data:`_MODULES`)."""
        name = self.name.lower()
        return _MODULES.get(name) or name.replace("-", "_").replace(".", "_")


_MODULES = {"python-json-logger": "pythonjsonlogger"}  # distributions whose package has another name


@dataclass(frozen=True)
class Installed:
    """How bertserve came to be importable here."""

    checkout: Path | None  # the source checkout it runs from, or was installed from
    editable: bool  # installed with ``pip install -e`` (or run from a checkout not installed at all)


def missing_server_requirements() -> list[Requirement]:
    """The ``server`` extra's requirements that apply to this platform and are not installed."""
    return [requirement for requirement in server_requirements() if not _installed(requirement)]


def server_requirements() -> list[Requirement]:
    """The ``server`` extra: setup.py's, from a source checkout; else the installed metadata's."""
    setup_py = _CHECKOUT / "setup.py"
    if setup_py.is_file():
        lines = _setup_py_extra(setup_py.read_text(encoding="utf-8"), EXTRA)
    else:
        try:
            lines = importlib.metadata.requires(DISTRIBUTION) or []
        except importlib.metadata.PackageNotFoundError:
            return []
        # The metadata lists every requirement: the extra's are those whose marker names an extra.
        lines = [line for line in lines if "extra" in line.partition(";")[2]]
    parsed = (parse_requirement(line, EXTRA) for line in lines)
    return [requirement for requirement in parsed if requirement is not None]


def install_command(missing: list[Requirement], installed: Installed | None = None, cwd: str | None = None) -> str:
    """The command that installs ``missing``, said as the user at ``cwd`` would type it."""
    installed = how_installed() if installed is None else installed
    cwd = os.getcwd() if cwd is None else cwd
    pip = _pip(cwd)
    if installed.checkout is not None:
        target = shlex.quote(f"{_shown(installed.checkout, cwd)}[{EXTRA}]")
        return f"{pip} install {'-e ' if installed.editable else ''}{target}"
    return f"{pip} install {' '.join(shlex.quote(requirement.spec) for requirement in missing)}"


def how_installed() -> Installed:
    """How this bertserve was installed (see :func:`installed_from`)."""
    try:
        direct_url = importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        direct_url = None
    return installed_from(_CHECKOUT, direct_url)


def installed_from(package_parent: Path, direct_url: str | None) -> Installed:
    """From a checkout (``package_parent``, the folder above the package, holds setup.py), or
    from the directory pip installed it from (its ``direct_url.json``) if that still holds
    setup.py; else from an index or a wheel."""
    origin = json.loads(direct_url) if direct_url else {}
    editable = bool(origin.get("dir_info", {}).get("editable", False))
    if (package_parent / "setup.py").is_file():
        return Installed(package_parent, editable=editable or not direct_url)
    url = urlparse(str(origin.get("url", "")))
    source = Path(unquote(url.path))
    if url.scheme == "file" and "dir_info" in origin and (source / "setup.py").is_file():
        return Installed(source, editable=editable)
    return Installed(None, editable=False)


def parse_requirement(line: str, extra: str) -> Requirement | None:
    """``line`` of setup.py's extra or of the metadata (``'uvloop>=0.19; sys_platform !=
    "win32" and extra == "server"'``) if it belongs to ``extra`` and applies here."""
    spec, _, marker = (part.strip() for part in line.partition(";"))
    name = re.match(r"[A-Za-z0-9._-]+", spec)
    if name is None or (marker and not _marker_holds(marker, extra)):
        return None
    return Requirement(name[0], spec.replace(" ", ""))


def _marker_holds(marker: str, extra: str) -> bool:
    try:
        from packaging.markers import Marker
    except ImportError:  # not every client-only install has it: the markers bertserve uses, by hand
        return _simple_marker_holds(marker, extra)
    return Marker(marker).evaluate({"extra": extra})


def _simple_marker_holds(marker: str, extra: str) -> bool:
    """A marker of ``NAME ==/!= 'VALUE'`` clauses joined by ``and``; a clause of another form
    counts as true."""
    values = {"extra": extra, "sys_platform": sys.platform, "os_name": os.name}
    for clause in marker.split(" and "):
        found = re.fullmatch(r"\s*(\w+)\s*(==|!=)\s*['\"]([^'\"]*)['\"]\s*", clause)
        if found is None or found[1] not in values:
            continue
        if (values[found[1]] == found[3]) != (found[2] == "=="):
            return False
    return True


def _setup_py_extra(source: str, extra: str) -> list[str]:
    """The requirements of ``extra`` in a setup.py's ``extras_require={...}`` literal."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.keyword) and node.arg == "extras_require":
            try:
                return list(ast.literal_eval(node.value).get(extra, []))
            except ValueError:  # not a literal
                return []
    return []


def _installed(requirement: Requirement) -> bool:
    """Whether pip installed ``requirement``'s distribution here (whatever its import name:
    pyzmq is ``zmq``), or, without its metadata, a package of its name can be imported."""
    try:
        importlib.metadata.distribution(requirement.name)
        return True
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        return importlib.util.find_spec(requirement.module) is not None
    except (ImportError, ValueError):  # a parent package that cannot be imported, or a broken one
        return False


def _pip(cwd: str) -> str:
    """``pip`` when the one on PATH installs for this Python, else this Python's ``-m pip``."""
    found = shutil.which("pip")
    if found is not None and os.path.dirname(os.path.abspath(found)) == os.path.dirname(sys.executable):
        return "pip"
    return f"{shlex.quote(_shown(Path(sys.executable), cwd))} -m pip"


def _shown(path: Path, cwd: str) -> str:
    """``path`` relative to ``cwd`` when it is there or below, else whole."""
    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute, os.path.abspath(cwd))
    return absolute if relative.startswith(os.pardir) else relative
