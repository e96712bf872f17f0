"""Models by their Hub id (server/model/hub.py), fetched by the real huggingface_hub from a
stand-in for the Hub on loopback (tests/hub_standin.py) into a cache of the test's own."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import pytest
from bertserve.server.config.model import ModelConfig
from bertserve.server.errors import ConfigError, HubError
from bertserve.server.model.hub import ModelId, fetch_model, is_model_id, revision_fault
from bertserve.server.model.hub_files import needed_files
from bertserve.server.model.model_dir import inspect_model
from bertserve.server.testing import tiny_bert
from hub_standin import HubStandIn, read_directory

NEEDED = [
    "1_Pooling/config.json",
    "config.json",
    "model.safetensors",
    "modules.json",
    "sentence_bert_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
]


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The tiny sentence-transformers BERT, with what a Hub repository holds beside it."""
    directory = str(tmp_path_factory.mktemp("tiny_st"))
    tiny_bert.write_tiny_bert(directory, "huggingface", seed=1, tokenizer_json=True, sentence_transformers=True)
    files = read_directory(directory)
    files.update({"README.md": b"# tiny\n", "pytorch_model.bin": b"\x80\x04pickled", "onnx/model.onnx": b"onnx"})
    return files


@pytest.fixture
def hub(tiny_files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> Iterator[HubStandIn]:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # whatever this machine's shell says
    with HubStandIn() as standin:
        standin.add("org/tiny", tiny_files, revisions={"v1": ""})
        standin.repos["org/tiny"].revisions["v1"] = standin.repos["org/tiny"].commit
        yield standin


def fetch(hub: HubStandIn, cache: Path, model_id: str = "org/tiny", **options: object) -> object:
    return fetch_model(model_id, cache_dir=str(cache), endpoint=hub.url, **{"offline": False, **options})


def _files(directory: str) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
        for root, _, names in os.walk(directory)
        for name in names
    )


def test_a_model_is_fetched_with_only_the_files_it_needs(hub: HubStandIn, tmp_path: Path) -> None:
    model = fetch_model("org/tiny@v1", cache_dir=str(tmp_path), endpoint=hub.url, offline=False)
    repo = hub.repos["org/tiny"]
    assert (model.repo_id, model.revision, model.commit) == ("org/tiny", "v1", repo.commit)
    assert model.directory == str(tmp_path / "models--org--tiny" / "snapshots" / repo.commit)
    assert _files(model.directory) == NEEDED
    for path in _files(model.directory):
        assert (Path(model.directory) / path).read_bytes() == repo.files[path], path
    assert inspect_model(ModelConfig.of(model_dir=model.directory)).layout == "huggingface"
    fetched = {
        path.split("/resolve/")[1].split("/", 1)[1]
        for method, path in hub.requests
        if method == "GET" and "/resolve/" in path
    }
    assert "pytorch_model.bin" not in fetched and "onnx/model.onnx" not in fetched and "README.md" not in fetched


def test_a_warm_cache_is_served_offline_without_touching_the_network(
    hub: HubStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = fetch(hub, tmp_path)
    hub.requests.clear()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # as HF_HUB_OFFLINE=1 sets it
    assert fetch_model("org/tiny", cache_dir=str(tmp_path), endpoint=hub.url) == first  # offline: from the env
    assert hub.requests == []
    hub.stop()
    assert fetch_model("org/tiny", cache_dir=str(tmp_path), endpoint=hub.url) == first


def test_a_warm_cache_online_asks_only_which_commit_the_revision_is(hub: HubStandIn, tmp_path: Path) -> None:
    first = fetch(hub, tmp_path)
    hub.requests.clear()
    assert fetch(hub, tmp_path) == first
    assert hub.requests == [("GET", "/api/models/org/tiny")]


def test_a_model_another_program_downloaded_is_not_downloaded_again(hub: HubStandIn, tmp_path: Path) -> None:
    """sentence-transformers downloads the whole repository with huggingface_hub, into the same cache."""
    huggingface_hub.snapshot_download("org/tiny", cache_dir=str(tmp_path), endpoint=hub.url)
    hub.requests.clear()
    model = fetch(hub, tmp_path)
    assert model.commit == hub.repos["org/tiny"].commit  # type: ignore[attr-defined]
    assert [request for request in hub.requests if "/resolve/" in request[1]] == []


def test_a_transfer_cut_short_is_never_served_and_the_next_start_completes_it(hub: HubStandIn, tmp_path: Path) -> None:
    hub.repos["org/tiny"].cut = {"model.safetensors"}
    with pytest.raises(HubError) as cut:
        fetch(hub, tmp_path)
    assert "was cut short" in str(cut.value) and "nothing partial is kept or served: start again" in str(cut.value)
    blobs = list((tmp_path / "models--org--tiny" / "blobs").iterdir())
    weights = hub.repos["org/tiny"].files["model.safetensors"]
    assert all(blob.stat().st_size != len(weights) // 2 for blob in blobs)  # no half file, nor .incomplete
    assert not any(blob.name.endswith(".incomplete") for blob in blobs)
    with pytest.raises(HubError) as offline:
        fetch(hub, tmp_path, offline=True)
    assert "holds no whole copy of org/tiny" in str(offline.value)
    hub.repos["org/tiny"].cut = set()
    model = fetch(hub, tmp_path)
    assert (Path(model.directory) / "model.safetensors").read_bytes() == weights  # type: ignore[attr-defined]


def test_a_file_the_hub_lists_but_does_not_serve(hub: HubStandIn, tmp_path: Path) -> None:
    hub.repos["org/tiny"].missing = {"model.safetensors"}
    with pytest.raises(HubError) as missing:
        fetch(hub, tmp_path)
    assert str(missing.value) == (
        "the Hub lists model.safetensors in org/tiny but does not serve it (404); try again later, or pick another "
        "revision"
    )


def test_a_revision_that_does_not_exist(hub: HubStandIn, tmp_path: Path) -> None:
    with pytest.raises(HubError) as wrong:
        fetch(hub, tmp_path, "org/tiny@v9")
    assert str(wrong.value) == (
        "org/tiny has no revision 'v9' on the Hub: name a branch, tag or commit it has (its 'Files and versions' "
        "page lists them), or leave @v9 out for the default branch"
    )


def test_an_unknown_id(hub: HubStandIn, tmp_path: Path) -> None:
    with pytest.raises(HubError) as unknown:
        fetch(hub, tmp_path, "org/nothing")
    assert str(unknown.value) == (
        f"the Hub ({hub.url}) has no model org/nothing that this token may read (401): check the id (ORG/NAME, "
        "as on its page); if it is private or gated, set HF_TOKEN to a token of an account that may read it, "
        "or run `hf auth login`"
    )


def test_a_gated_model_needs_a_token_and_takes_it_from_hf_token(
    hub: HubStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = hub.repos["org/tiny"]
    repo.gated = True
    with pytest.raises(HubError) as gated:
        fetch(hub, tmp_path)
    assert str(gated.value) == (
        "org/tiny is a gated model, and the Hub refused it (401): accept its terms on its page, then set HF_TOKEN "
        "to a token of an account that may read it, or run `hf auth login`"
    )
    monkeypatch.setenv("HF_TOKEN", repo.token)
    assert fetch(hub, tmp_path).commit == repo.commit  # type: ignore[attr-defined]


def test_pytorch_weights_only_are_refused_with_how_to_convert_them(hub: HubStandIn, tmp_path: Path) -> None:
    files = {k: v for k, v in hub.repos["org/tiny"].files.items() if k != "model.safetensors"}
    hub.add("org/pickled", files)
    with pytest.raises(HubError) as pickled:
        fetch(hub, tmp_path, "org/pickled")
    message = str(pickled.value)
    assert message.startswith(
        "org/pickled has only PyTorch weights (pytorch_model.bin), and bertserve does not unpickle files from the "
        "network: it reads model.safetensors."
    )
    assert "`hf download org/pickled --local-dir DIR`" in message and "save_file(" in message
    assert "--model-dir" in message
    assert not any(path.endswith("pytorch_model.bin") for _, path in hub.requests)


def test_tensorflow_h5_or_onnx_weights_only_are_refused(hub: HubStandIn, tmp_path: Path) -> None:
    files = {
        k: v for k, v in hub.repos["org/tiny"].files.items() if k not in ("model.safetensors", "pytorch_model.bin")
    }
    hub.add("org/onnx", {**files, "tf_model.h5": b"h5"})
    with pytest.raises(HubError) as other:
        fetch(hub, tmp_path, "org/onnx")
    assert str(other.value).startswith(
        "org/onnx has its weights only as tf_model.h5, onnx/model.onnx, which bertserve does not read"
    )
    assert "save_pretrained(DIR)" in str(other.value)


def test_offline_with_nothing_cached(hub: HubStandIn, tmp_path: Path) -> None:
    with pytest.raises(HubError) as offline:
        fetch(hub, tmp_path, "org/tiny@v1", offline=True)
    assert str(offline.value) == (
        "HF_HUB_OFFLINE is set and the Hub cache holds no whole copy of org/tiny@v1: run bertserve once with the "
        "network (and without HF_HUB_OFFLINE), or `hf download org/tiny --local-dir DIR` on a machine with "
        "network, then serve DIR with --model-dir"
    )
    assert hub.requests == []


def test_no_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with socket.socket() as closed:  # a port nobody listens on: connections are refused
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
    with pytest.raises(HubError) as unreachable:
        fetch_model("org/tiny", cache_dir=str(tmp_path), endpoint=endpoint, offline=False)
    message = str(unreachable.value)
    assert message.startswith(f"cannot reach the Hub at {endpoint} (ConnectError: ")
    assert message.endswith(
        "and the Hub cache holds no whole copy of org/tiny: check the network (a proxy, HF_ENDPOINT), or "
        "`hf download org/tiny --local-dir DIR` on a machine with network, then serve DIR with --model-dir"
    )


def test_no_network_with_a_warm_cache_serves_what_the_cache_last_saw(hub: HubStandIn, tmp_path: Path) -> None:
    first = fetch(hub, tmp_path)
    endpoint = hub.url
    hub.stop()
    assert fetch_model("org/tiny", cache_dir=str(tmp_path), endpoint=endpoint, offline=False) == first


def test_a_google_checkpoint_repository(hub: HubStandIn, tmp_path: Path) -> None:
    files = {
        name: b"x"
        for name in ("bert_config.json", "bert_model.ckpt.index", "bert_model.ckpt.data-00000-of-00001", "vocab.txt")
    }
    hub.add("google/tiny", {**files, "README.md": b"x", "pytorch_model.bin": b"x"})
    model = fetch(hub, tmp_path, "google/tiny")
    assert _files(model.directory) == sorted(files)  # type: ignore[attr-defined]


def test_shards_and_module_folders_are_chosen_from_what_the_model_names(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}'
    )
    (tmp_path / "modules.json").write_text('[{"path": ""}, {"path": "1_Pooling"}, {"path": "2_Dense"}]')
    listing = [
        "config.json",
        "model.safetensors.index.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "pytorch_model.bin",
        "modules.json",
        "tokenizer.json",
        "vocab.txt",
        "1_Pooling/config.json",
        "2_Dense/config.json",
        "2_Dense/model.safetensors",
        "2_Dense/pytorch_model.bin",
        "3_Unused/config.json",
    ]
    assert needed_files(listing, str(tmp_path), "org/big") == [
        "config.json",
        "model.safetensors.index.json",
        "tokenizer.json",
        "modules.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "1_Pooling/config.json",
        "2_Dense/config.json",
        "2_Dense/model.safetensors",
    ]
    with pytest.raises(HubError, match=r"names model-00002-of-00002\.safetensors, which the repository does not have"):
        needed_files([p for p in listing if p != "model-00002-of-00002.safetensors"], str(tmp_path), "org/big")
    only_pickled = [p for p in listing if p != "2_Dense/model.safetensors"]
    with pytest.raises(HubError, match=r"its 2_Dense module has its weights only as pytorch_model\.bin.*DIR/2_Dense"):
        needed_files(only_pickled, str(tmp_path), "org/big")


def test_model_ids_and_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ModelId.parse("BAAI/bge-small-en-v1.5") == ModelId("BAAI/bge-small-en-v1.5", None)
    assert ModelId.parse("BAAI/bge-small-en-v1.5@refs/pr/3") == ModelId("BAAI/bge-small-en-v1.5", "refs/pr/3")
    assert str(ModelId("org/name", "v1")) == "org/name@v1"
    for bad in ("bge-small", "org/name/extra", "org--x/name", "org/na..me", "org/name@"):
        with pytest.raises(ConfigError, match="is not a Hub model id: expected ORG/NAME or ORG/NAME@REVISION"):
            ModelId.parse(bad)
    monkeypatch.chdir(tmp_path)
    assert is_model_id("models/minilm")
    (tmp_path / "models" / "minilm").mkdir(parents=True)
    assert not is_model_id("models/minilm")  # a directory always wins


HOSTILE_REVISIONS = [
    "../../x",
    "..",
    "v1/../../main",
    ".hidden",
    "refs/.pr/1",
    "main.lock",
    "refs/pr.lock/1",
    "/main",
    "main/",
    "refs//pr",
    "main.",
    "main~1",
    "main^",
    "a:b",
    "a?",
    "a*",
    "a[0]",
    "a\\b",
    "a\x01b",
    "a\x7fb",
]


@pytest.mark.parametrize("revision", HOSTILE_REVISIONS)
def test_a_revision_git_would_refuse_is_refused_before_the_hub_is_asked(
    revision: str, hub: HubStandIn, tmp_path: Path
) -> None:
    refused = r"the revision .* of org/tiny .*, which git refuses in the name of a branch or tag: name a branch"
    with pytest.raises(ConfigError, match=refused):
        ModelId.parse(f"org/tiny@{revision}")
    with pytest.raises(ConfigError, match=refused):
        ModelId("org/tiny", revision)  # however the id is made
    with pytest.raises(ConfigError, match=refused):
        fetch(hub, tmp_path / "cache", f"org/tiny@{revision}")
    assert hub.requests == [] and not (tmp_path / "cache").exists()


def test_the_revisions_git_and_the_hub_name_are_taken() -> None:
    for revision in ("main", "v1.0", "refs/pr/1", "refs/convert/parquet", "feature/x-1", "a" * 40, "héllo"):
        assert ModelId.parse(f"org/name@{revision}") == ModelId("org/name", revision)
    with pytest.raises(ConfigError, match=r"'@' of org/name is '@'"):
        ModelId("org/name", "@")
    with pytest.raises(ConfigError, match=r"holds '@\{'"):
        ModelId("org/name", "main@{1}")


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_revisions_are_judged_as_git_check_ref_format_judges_them() -> None:
    good = ["main", "v1.0", "refs/pr/1", "a" * 40, "x@y", "a.b/c"]
    for revision in [*good, *HOSTILE_REVISIONS, "@", "main@{1}", "a b", "a/.b", "a/b."]:
        git = subprocess.run(["git", "check-ref-format", "--allow-onelevel", revision], check=False).returncode == 0
        assert (revision_fault(revision) is None) == git, revision
