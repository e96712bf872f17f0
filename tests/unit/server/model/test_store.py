"""Models kept in object storage, synced into the local cache: against a real S3 server on
loopback (moto's), through s3fs as a user's server reaches AWS, MinIO or R2.

What a server does with them while serving (a swap under load, a rollback) is in
tests/integration/test_model_store.py; here is the sync itself: what crosses the network, what
is refused and why, and what the cache holds after each failure."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from bertserve.server.errors import ConfigError
from bertserve.server.model.checksum import MANIFEST, file_sha256, manifest_problems
from bertserve.server.model.store import TRIES_PER_VERSION, ModelStore
from bertserve.server.model.store_files import Pace, StoreError, backoff_s, parse_store_url
from store_standin import BUCKET, CuttingProxy, S3Standin, StrictS3, s3_env, strict_s3

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def standin() -> Iterator[S3Standin]:
    store = S3Standin()
    yield store
    store.stop()


@pytest.fixture
def env(standin: S3Standin) -> Iterator[S3Standin]:
    with s3_env(standin):
        yield standin


def model(directory: Path, weights: bytes, vocab: str = "[PAD]\nhello\n") -> str:
    """A model directory's files, as the store sees them (the store reads no model)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"hidden_size": 8}))
    (directory / "vocab.txt").write_text(vocab)
    (directory / "model.safetensors").write_bytes(weights)
    (directory / "sub").mkdir(exist_ok=True)
    (directory / "sub" / "tokenizer_config.json").write_text("{}")
    return str(directory)


def prefix(tmp_path: Path) -> str:
    return f"m-{abs(hash(str(tmp_path))) % 10**9}"


def test_a_first_sync_brings_every_file_checked_and_the_next_look_fetches_nothing(
    env: S3Standin, tmp_path: Path
) -> None:
    name = prefix(tmp_path)
    env.upload(f"{name}/1", model(tmp_path / "v1", os.urandom(300_000)))
    store = ModelStore(f"s3://{BUCKET}/{name}/", str(tmp_path / "cache"))
    root, rejected = store.start("latest")
    assert rejected == [] and root == store.root and store.cached_versions() == [1]
    assert manifest_problems(store.local(1)) == []
    assert (store.stats.files_fetched, store.stats.bytes_fetched) == (
        4,
        sum(
            os.path.getsize(os.path.join(store.local(1), rel))
            for rel in ("config.json", "vocab.txt", "model.safetensors", "sub/tokenizer_config.json")
        ),
    )
    before = (store.stats.listings, store.stats.manifest_reads, store.stats.files_fetched)
    for _ in range(3):  # unchanged: each poll lists the versions once, and reads and fetches nothing
        assert store.pull("latest", 1, 1).error is None
    assert (store.stats.listings, store.stats.manifest_reads, store.stats.files_fetched) == (
        before[0] + 3,
        before[1],
        before[2],
    )
    assert store.last_sync is not None and time.time() - store.last_sync < 30


def test_a_new_version_fetches_only_the_files_whose_digest_changed(env: S3Standin, tmp_path: Path) -> None:
    name = prefix(tmp_path)
    weights = os.urandom(200_000)
    env.upload(f"{name}/1", model(tmp_path / "v1", weights))
    store = ModelStore(f"s3://{BUCKET}/{name}", str(tmp_path / "cache"))
    store.start("latest")
    env.upload(f"{name}/2", model(tmp_path / "v2", weights, vocab="[PAD]\nhello\nworld\n"))
    fetched, moved = store.stats.files_fetched, store.stats.bytes_fetched
    assert store.pull("latest", 1, 1).error is None
    assert store.cached_versions() == [1, 2]
    assert store.stats.files_fetched - fetched == 1  # vocab.txt alone; the weights are linked from version 1
    assert store.stats.bytes_fetched - moved == len("[PAD]\nhello\nworld\n")
    assert manifest_problems(store.local(2)) == []
    assert os.path.samefile(store.local(1) + "/model.safetensors", store.local(2) + "/model.safetensors")


def test_a_corrupted_object_is_refused_by_name_and_the_cache_keeps_what_it_had(env: S3Standin, tmp_path: Path) -> None:
    name = prefix(tmp_path)
    env.upload(f"{name}/1", model(tmp_path / "v1", os.urandom(50_000)))
    store = ModelStore(f"s3://{BUCKET}/{name}", str(tmp_path / "cache"))
    store.start("latest")
    env.upload(f"{name}/2", model(tmp_path / "v2", os.urandom(50_000)))
    env.put(f"{name}/2/model.safetensors", os.urandom(50_000))  # rotten in the store after the manifest
    pulled = store.pull("latest", 1, 1)
    assert [r.number for r in pulled.rejected] == [2]
    reason = pulled.rejected[0].reason
    assert "model.safetensors" in reason and "does not match the manifest" in reason and "arrived whole" in reason
    assert store.cached_versions() == [1] and manifest_problems(store.local(1)) == []
    assert not os.path.exists(store.local(2))
    # the same version is left alone after a bounded number of syncs, until its manifest changes
    for _ in range(TRIES_PER_VERSION):
        store.pull("latest", 1, 1)
    fetched = store.stats.files_fetched
    assert "left alone" in store.pull("latest", 1, 1).rejected[0].reason
    assert store.stats.files_fetched == fetched
    env.upload(f"{name}/2", model(tmp_path / "v2b", os.urandom(50_000)))  # re-uploaded whole: tried again
    assert store.pull("latest", 1, 1).rejected == () and store.cached_versions() == [1, 2]


def test_a_transfer_cut_half_way_is_taken_up_where_it_stopped(standin: S3Standin, tmp_path: Path) -> None:
    name = prefix(tmp_path)
    weights = os.urandom(3_000_000)
    standin.upload(f"{name}/1", model(tmp_path / "v1", weights))
    proxy = CuttingProxy((standin.host, standin.port), cut_path=f"{name}/1/model.safetensors", cut_after=1_200_000)
    try:
        with s3_env(standin, proxy.endpoint):
            store = ModelStore(f"s3://{BUCKET}/{name}", str(tmp_path / "cache"))
            store.start("latest")
    finally:
        proxy.close()
    assert proxy.cut == 1
    assert file_sha256(store.local(1) + "/model.safetensors") == file_sha256(str(tmp_path / "v1" / "model.safetensors"))
    ranges = [line for line in proxy.requests if b"model.safetensors" in line and line.startswith(b"GET")]
    assert len(ranges) >= 2
    # taken up where it stopped: the bytes fetched are the file's, not the file's and a restart's
    assert store.stats.bytes_fetched < len(weights) + 200_000


def test_the_rate_limit_holds_over_a_transfer(env: S3Standin, tmp_path: Path) -> None:
    name = prefix(tmp_path)
    size, rate = 3_000_000, 2_000_000
    env.upload(f"{name}/1", model(tmp_path / "v1", os.urandom(size)))
    store = ModelStore(f"s3://{BUCKET}/{name}", str(tmp_path / "cache"), max_bytes_per_s=rate)
    started = time.monotonic()
    store.start("latest")
    elapsed = time.monotonic() - started
    # never faster than the limit (benchmarks/model_sync.py measures how close it stays over 30 MB)
    assert store.stats.bytes_fetched / elapsed <= rate * 1.05, elapsed


def test_the_pace_sleeps_what_the_rate_needs() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    pace = Pace(1_000_000, clock=lambda: now[0], sleep=sleep)
    for _ in range(8):
        pace.take(250_000)
    assert pace.chunk == 250_000 and sum(slept) == pytest.approx(2.0)  # no burst: the first chunk waits its share
    assert max(backoff_s(n, rng=lambda: 1.0) for n in range(1, 30)) == 20.0 and backoff_s(1, rng=lambda: 1.0) == 0.5


def test_a_store_that_is_down_serves_the_cache_and_with_nothing_cached_says_why(
    standin: S3Standin, tmp_path: Path
) -> None:
    name = prefix(tmp_path)
    standin.upload(f"{name}/1", model(tmp_path / "v1", os.urandom(10_000)))
    with s3_env(standin):
        ModelStore(f"s3://{BUCKET}/{name}", str(tmp_path / "cache")).start("latest")
    with s3_env(standin, "http://127.0.0.1:9"):  # nothing listens on the discard port
        store = ModelStore(f"s3://{BUCKET}/{name}", str(tmp_path / "cache"))
        root, _ = store.start("latest")
        assert root == store.root and store.cached_versions() == [1] and store.stats.failures == 1
        assert "127.0.0.1:9" in store.stats.last_error
        pulled = store.pull("latest", 1, 1)
        assert pulled.error is not None and store.stats.failures == 2
        with pytest.raises(StoreError, match=r"listing s3://models/.*: Could not connect"):
            ModelStore(f"s3://{BUCKET}/{name}", str(tmp_path / "empty-cache")).start("latest")


def test_what_the_store_holds_must_be_a_model_with_its_manifest(env: S3Standin, tmp_path: Path) -> None:
    name = prefix(tmp_path)
    with pytest.raises(StoreError, match=r"holds neither a bertserve\.sha256"):
        ModelStore(f"s3://{BUCKET}/{name}-nothing", str(tmp_path / "c")).start("latest")
    env.upload(f"{name}/1", model(tmp_path / "v1", b"w"), manifest=False)
    with pytest.raises(StoreError, match=r"has no bertserve.sha256: write one with `bertserve manifest DIR`"):
        ModelStore(f"s3://{BUCKET}/{name}", str(tmp_path / "c")).start("latest")
    digest = "0" * 64
    for hostile, why in [
        (f"{digest}  ../../etc/passwd\n", "not a plain relative path"),
        (f"{digest}  /etc/passwd\n", "not a plain relative path"),
        (f"{digest}  .hidden\n", "not a plain relative path"),
        (f"{digest}  a\n{digest}  a\n", "a second time"),
        ("not a manifest\n", "is not '<sha256>  <path>'"),
        ("x" * (1 << 21), "over 1048576 bytes"),
        (f"{digest}  {MANIFEST}\n", "cannot be a model file"),
    ]:
        env.put(f"{name}-bad/1/{MANIFEST}", hostile.encode())
        with pytest.raises(StoreError, match=why):
            ModelStore(f"s3://{BUCKET}/{name}-bad", str(tmp_path / "c")).start("latest")
        assert not os.path.exists(tmp_path / "c" / "escaped")


def test_one_model_at_the_url_and_a_version_asked_for_by_number(env: S3Standin, tmp_path: Path) -> None:
    name = prefix(tmp_path)
    env.upload(name, model(tmp_path / "one", b"w1"))
    store = ModelStore(f"s3://{BUCKET}/{name}", str(tmp_path / "cache"))
    path, _ = store.start("latest")
    assert path == store.local(None) and manifest_problems(path) == []
    env.upload(f"{name}-r/1", model(tmp_path / "r1", b"w1"))
    env.upload(f"{name}-r/2", model(tmp_path / "r2", b"w2"))
    numbered = ModelStore(f"s3://{BUCKET}/{name}-r", str(tmp_path / "cache"))
    numbered.start("1")
    assert numbered.cached_versions() == [1]
    with pytest.raises(StoreError, match=r"has no bertserve\.sha256"):
        numbered.start("7")


def test_old_versions_are_pruned_but_never_the_one_served(env: S3Standin, tmp_path: Path) -> None:
    name = prefix(tmp_path)
    store = ModelStore(f"s3://{BUCKET}/{name}", str(tmp_path / "cache"), keep_versions=2)
    for number in range(1, 5):
        env.upload(f"{name}/{number}", model(tmp_path / f"v{number}", os.urandom(1000)))
        if number == 1:
            store.start("latest")
        else:
            store.pull("latest", number - 1, 1)  # version 1 still served: a swap that failed, say
    assert store.cached_versions() == [1, 3, 4]
    store.prune(4)
    assert store.cached_versions() == [3, 4]
    restarted = ModelStore(f"s3://{BUCKET}/{name}", str(tmp_path / "cache"), keep_versions=1)
    restarted.start("3")  # a version asked for by number stays, whatever is newer
    assert restarted.cached_versions() == [3, 4]


def test_urls_with_credentials_or_no_backend_are_refused_before_any_request() -> None:
    with pytest.raises(ConfigError, match=r"holds credentials.*AWS_ACCESS_KEY_ID") as caught:
        parse_store_url("s3://AKIAEXAMPLE:hunter2@models/minilm")
    assert "hunter2" not in str(caught.value) and "AKIAEXAMPLE" not in str(caught.value)
    for bad, why in [
        ("s3://", "names no bucket"),
        ("s3://models/a/../b", r"\.\. in its path"),
        ("s3://models/a?versionId=3", "query or fragment"),
        ("ftp://models/a", "not a store URL"),
    ]:
        with pytest.raises(ConfigError, match=why):
            parse_store_url(bad)
    assert parse_store_url("gs://bucket/a/").url == "gs://bucket/a"


@pytest.fixture(scope="module")
def strict_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StrictS3]:
    with strict_s3(model(tmp_path_factory.mktemp("strict") / "v1", b"weights"), "strict/1") as store:
        yield store


def test_wrong_credentials_are_refused_clearly_and_never_shown(
    strict_store: StrictS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, good = strict_store.endpoint, strict_store.good
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", good["AWS_ACCESS_KEY_ID"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(StoreError, match=r"access denied .*AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY") as caught:
        ModelStore(f"s3://{BUCKET}/strict", str(tmp_path / "cache")).start("latest")
    assert caught.value.lasting and "not-the-secret" not in str(caught.value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", good["AWS_SECRET_ACCESS_KEY"])
    store = ModelStore(f"s3://{BUCKET}/strict", str(tmp_path / "cache"))
    store.start("latest")
    assert store.cached_versions() == [1]


def test_a_web_server_that_lists_its_folders_serves_as_a_store(tmp_path: Path) -> None:
    """``https://`` through fsspec's HTTP backend (plain HTTP on loopback here): the versions
    found in the folder's listing, each file checked against the manifest."""
    import functools
    import http.server
    import threading

    from bertserve.server.model.checksum import write_manifest

    site = tmp_path / "site"
    for number in (1, 2):
        write_manifest(model(site / "repo" / str(number), os.urandom(20_000 + number)))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/repo/"
        store = ModelStore(url, str(tmp_path / "cache"))
        _, rejected = store.start("latest")
        assert rejected == [] and store.cached_versions() == [2] and manifest_problems(store.local(2)) == []
        (site / "repo" / "1" / "model.safetensors").write_bytes(os.urandom(20_001))  # changed after its manifest
        pulled = store.pull("1", 2, 2)
        assert pulled.error is not None and "model.safetensors does not match the manifest" in pulled.error
        assert store.cached_versions() == [2]
    finally:
        server.shutdown()
        server.server_close()


def test_processes_sharing_a_cache_sync_one_at_a_time_and_fetch_once(env: S3Standin, tmp_path: Path) -> None:
    """A race: four stores on one cache start at once (a head and worker hosts on one machine).
    The lock lets one fetch; the others find the version whole in the cache, and none sees it
    half written."""
    import threading

    name = prefix(tmp_path)
    env.upload(f"{name}/1", model(tmp_path / "v1", os.urandom(2_000_000)))
    stores = [ModelStore(f"s3://{BUCKET}/{name}", str(tmp_path / "cache"), max_bytes_per_s=4_000_000) for _ in range(4)]
    found: list[object] = []
    gate = threading.Barrier(len(stores))

    def start(store: ModelStore) -> None:
        gate.wait()
        try:
            root, _ = store.start("latest")
            found.append(manifest_problems(os.path.join(root, "1")))
        except Exception as exc:
            found.append(exc)

    threads = [threading.Thread(target=start, args=(store,)) for store in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert found == [[], [], [], []], found
    assert sum(store.stats.files_fetched for store in stores) == 4  # the four files, fetched by one of them
    assert sum(store.stats.manifest_reads for store in stores) == 1  # the others found the version in the cache
