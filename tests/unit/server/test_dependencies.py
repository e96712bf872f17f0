"""What the server commands check is installed, and the install command they suggest, for
each way bertserve can be installed."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest
from bertserve.server import dependencies
from bertserve.server.dependencies import Installed, Requirement, install_command, installed_from, parse_requirement

ROOT = Path(__file__).resolve().parents[3]


def test_a_requirement_belongs_to_its_extra_and_its_platform() -> None:
    assert parse_requirement('tokenizers>=0.15; extra == "server"', "server") == Requirement(
        "tokenizers", "tokenizers>=0.15"
    )
    assert parse_requirement('pytest>=8; extra == "test"', "server") is None
    assert parse_requirement("tokenizers>=0.15", "server") == Requirement("tokenizers", "tokenizers>=0.15")
    uvloop = parse_requirement("uvloop>=0.19; sys_platform != 'win32'", "server")
    assert (uvloop is None) == (sys.platform == "win32")
    assert Requirement("prometheus-client", "prometheus-client>=0.17").module == "prometheus_client"
    assert Requirement("python-json-logger", "python-json-logger>=3.1").module == "pythonjsonlogger"


@pytest.mark.parametrize("holds", [dependencies._marker_holds, dependencies._simple_marker_holds])
def test_markers_are_read_with_or_without_packaging(holds) -> None:
    assert holds('sys_platform != "win32" and extra == "server"', "server") == (sys.platform != "win32")
    assert not holds('sys_platform != "win32" and extra == "server"', "test")
    assert holds("extra == 'server'", "server")


def test_a_checkout_reads_setup_py_which_the_installed_metadata_follows() -> None:
    from_setup = dependencies._setup_py_extra((ROOT / "setup.py").read_text(encoding="utf-8"), "server")
    assert any(line.startswith("tensorflow") for line in from_setup)
    names = {requirement.name for requirement in dependencies.server_requirements()}
    assert {"tensorflow", "tokenizers", "fastapi", "uvicorn", "prometheus-client"} <= names
    installed = importlib.metadata.requires("bertserve") or []
    from_metadata = {r.name for line in installed if (r := parse_requirement(line, "server")) is not None}
    assert from_metadata - {"numpy", "pyzmq", "termcolor", "tqdm"} <= names  # setup.py may be newer than the install


def test_this_environment_has_every_server_package() -> None:
    assert dependencies.missing_server_requirements() == []


def test_an_installed_copy_checks_only_the_extras_distributions_by_their_metadata(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(dependencies, "_CHECKOUT", tmp_path)  # no setup.py: installed from a wheel, say
    requires = [
        "pyzmq>=25",
        "numpy>=1.24",
        'tokenizers>=0.15; extra == "server"',
        'pytest>=8; extra == "test"',
        'no-such-distribution-here>=1; extra == "server"',
    ]
    monkeypatch.setattr(importlib.metadata, "requires", lambda name: requires)
    names = [requirement.name for requirement in dependencies.server_requirements()]
    assert names == ["tokenizers", "no-such-distribution-here"]  # the client's own requirements are not the extra's
    missing = dependencies.missing_server_requirements()
    assert [requirement.name for requirement in missing] == ["no-such-distribution-here"]
    assert dependencies._installed(Requirement("pyzmq", "pyzmq"))  # imported as zmq: found by its metadata


MISSING = [Requirement("tokenizers", "tokenizers>=0.15"), Requirement("prometheus-client", "prometheus-client>=0.17")]


def test_from_a_checkout_the_command_installs_the_extra_from_it_as_it_was_installed(tmp_path: Path) -> None:
    checkout = tmp_path / "src" / "bertserve"
    editable = install_command(MISSING, Installed(checkout, editable=True), cwd=str(checkout))
    assert editable.endswith("install -e '.[server]'")
    elsewhere = install_command(MISSING, Installed(checkout, editable=True), cwd=str(tmp_path / "other"))
    assert elsewhere.endswith(f"install -e '{checkout}[server]'")
    below = install_command(MISSING, Installed(checkout, editable=False), cwd=str(tmp_path))
    assert below.endswith("install 'src/bertserve[server]'")


def test_from_an_index_the_command_names_the_missing_requirements() -> None:
    command = install_command(MISSING, Installed(None, editable=False), cwd="/")
    assert command.endswith("install 'tokenizers>=0.15' 'prometheus-client>=0.17'")
    assert command.startswith("pip ") or " -m pip " in command


def test_this_checkout_is_found_as_an_editable_install() -> None:
    installed = dependencies.how_installed()
    assert installed.checkout == ROOT and installed.editable


def test_how_it_was_installed_is_read_from_where_it_runs_and_from_direct_url(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    (checkout / "setup.py").write_text("")
    site = tmp_path / "site-packages" / "bertserve"  # where `pip install` put the package
    site.mkdir(parents=True)
    from_dir = f'{{"url": "{checkout.as_uri()}", "dir_info": {{}}}}'
    assert installed_from(checkout, None) == Installed(checkout, editable=True)  # run from it, not installed
    assert installed_from(checkout, f'{{"url": "{checkout.as_uri()}", "dir_info": {{"editable": true}}}}') == Installed(
        checkout, editable=True
    )
    assert installed_from(site, from_dir) == Installed(checkout, editable=False)
    (checkout / "setup.py").unlink()  # the checkout it came from is gone
    assert installed_from(site, from_dir) == Installed(None, editable=False)
    wheel = '{"url": "https://example.org/bertserve-0.1.0-py3-none-any.whl", "archive_info": {}}'
    assert installed_from(site, wheel) == Installed(None, editable=False)
    assert installed_from(site, None) == Installed(None, editable=False)  # from an index: no direct_url.json
