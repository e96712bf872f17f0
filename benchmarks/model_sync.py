"""A model kept in object storage: all-MiniLM-L6-v2 served from an S3 store on loopback, a new
version uploaded under a steady load, and the download rate limit over 30 MB.

moto's S3 server (on 127.0.0.1) stands in for the store; the server reaches it as it reaches
AWS or MinIO, through ``AWS_ENDPOINT_URL``. Version 1 is all-MiniLM-L6-v2; version 2 the same
model with its last LayerNorm scaled (as a fine-tune changes it), so every reply tells which
version made it. ``bertserve start --model-dir s3://models/minilm --poll-interval-s 30 --dtype
fp32`` serves it while two clients encode continuously; every reply is checked against the
in-process ``Encoder`` of the version it names. The report gives:

- what each unchanged poll cost (requests, files and bytes, from the server's status);
- the time from version 2's upload ending to the server serving it, and the replies that
  failed or were wrong;
- the vectors of the store's version 2 against a server of ``--model-dir`` on the same files;
- the rate a 30 MB sync reaches under ``--sync-max-bytes-per-s``, three runs.

    python benchmarks/model_sync.py --json benchmarks/report/model_sync.json --markdown benchmarks/report/model_sync.md
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bertserve.client import BertClient
from bertserve.server import Encoder
from bertserve.server.model.checksum import MANIFEST, model_files, write_manifest
from bertserve.server.testing.launcher import start_server
from lib.inputs import model_dir_or_exit, model_parser, read_corpus
from lib.report import describe_cpu, environment, tagged_log, write_report
from swapping.load import Load
from swapping.versions import write_version

BUCKET = "models"
POLL_S = 30.0
RATES = (10_000_000, 4_000_000)  # bytes a second
RATE_BYTES = 30_000_000
CLIENTS = 2
SIZES = (1, 5, 20)

log = tagged_log("model-sync")


def start_store() -> tuple[Any, dict[str, str]]:
    """moto's S3 server on a free loopback port, with the bucket; the server and the environment that reaches it."""
    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "benchmark",
        "AWS_SECRET_ACCESS_KEY": "benchmark-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    os.environ.update(env)
    s3().create_bucket(Bucket=BUCKET)
    return server, env


def s3() -> Any:
    import boto3

    return boto3.client("s3")


def upload(source: Path, prefix: str) -> float:
    """Upload a model directory's files, its manifest last; the seconds it took."""
    started = time.monotonic()
    rels = [rel.replace(os.sep, "/") for rel in model_files(str(source))] + [MANIFEST]
    client = s3()
    for rel in rels:
        client.upload_file(str(source / rel), BUCKET, f"{prefix}/{rel}")
    return time.monotonic() - started


def sync_stats(client: BertClient) -> dict[str, Any]:
    return dict(client.server_status.get("sync", {}))


def swap_under_load(versions: dict[int, Path], texts: list[str], cache: Path, env: dict[str, str]) -> dict[str, Any]:
    references = {number: Encoder(str(path), dtype="fp32").encode(texts) for number, path in versions.items()}
    upload(versions[1], "minilm/1")
    url = f"s3://{BUCKET}/minilm"
    server = start_server(
        *("--model-dir", url, "--model-cache", str(cache), "--poll-interval-s", str(POLL_S)),
        *("--dtype", "fp32", "--num-worker", "1"),
        env=env,
        timeout=600,
    )
    load = Load(server, texts, references, SIZES, log=log)
    try:
        with BertClient(**server.client_kwargs, timeout=120_000) as control:
            load.start(CLIENTS)
            before = sync_stats(control)
            log(f"steady: {2 * POLL_S + 5:.0f} s, two polls of an unchanged store")
            time.sleep(2 * POLL_S + 5)
            after = sync_stats(control)
            polls = after["listings"] - before["listings"]
            upload_s = upload(versions[2], "minilm/2")
            uploaded = time.monotonic()
            log(f"version 2 uploaded in {upload_s:.1f} s; waiting for it to serve")
            while control.server_status.get("model_version") != 2:
                if time.monotonic() - uploaded > 600:
                    raise SystemExit("version 2 did not serve within 10 minutes")
                time.sleep(0.2)
            serving_s = time.monotonic() - uploaded
            log(f"version 2 serves {serving_s:.1f} s after its upload ended")
            time.sleep(10)
            load.finish()
            synced = sync_stats(control)
            with BertClient(**server.client_kwargs, timeout=120_000) as client:
                store_vectors = client.encode(texts[:500])
    finally:
        load.finish()
        server.stop()
    plain = start_server("--model-dir", str(versions[2]), "--dtype", "fp32", "--num-worker", "1", timeout=600)
    try:
        with BertClient(**plain.client_kwargs, timeout=120_000) as client:
            plain_vectors = client.encode(texts[:500])
    finally:
        plain.stop()
    ours, theirs = store_vectors.astype(np.float64), plain_vectors.astype(np.float64)  # a cosine in float64
    cosines = np.sum(ours * theirs, axis=1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
    return {
        "poll_interval_s": POLL_S,
        "unchanged": {
            "polls": polls,
            "listings_per_poll": (after["listings"] - before["listings"]) / max(polls, 1),
            "manifest_reads": after["manifest_reads"] - before["manifest_reads"],
            "files_fetched": after["files_fetched"] - before["files_fetched"],
            "bytes_fetched": after["bytes_fetched"] - before["bytes_fetched"],
        },
        "version_2": {
            "upload_s": round(upload_s, 2),
            "serving_s_after_upload": round(serving_s, 1),
            "files_fetched": synced["files_fetched"] - after["files_fetched"],
            "files_reused": synced["files_reused"] - after["files_reused"],
            "bytes_fetched": synced["bytes_fetched"] - after["bytes_fetched"],
        },
        "replies": {"ok": load.count("ok"), "wrong": load.count("wrong"), "failed": load.count("failed")},
        "by_version": load.by_version(),
        "min_cosine_to_model_dir": float(cosines.min()),
        "max_abs_difference_to_model_dir": float(np.abs(store_vectors - plain_vectors).max()),
    }


def rate_limit(workdir: Path) -> dict[str, Any]:
    from bertserve.server.model.store import ModelStore

    source = workdir / "blob"
    source.mkdir()
    (source / "model.safetensors").write_bytes(np.random.default_rng(0).bytes(RATE_BYTES))
    write_manifest(str(source))
    upload(source, "ratetest/1")
    found: dict[str, Any] = {"bytes": RATE_BYTES, "limits": {}}
    for limit in (None, *RATES):
        transfers, syncs = [], []
        for run in range(3):
            cache = workdir / f"cache-{limit}-{run}"
            store = ModelStore(f"s3://{BUCKET}/ratetest", str(cache), max_bytes_per_s=limit)
            started = time.monotonic()
            store.start("latest")
            elapsed = time.monotonic() - started
            transfers.append(store.stats.bytes_fetched / store.stats.fetch_seconds)
            syncs.append(store.stats.bytes_fetched / elapsed)
            log(
                f"limit {limit}, run {run + 1}: transfer {transfers[-1] / 1e6:.2f} MB/s, "
                f"sync {syncs[-1] / 1e6:.2f} MB/s"
            )
        found["limits"][str(limit or "none")] = {
            "transfer_bytes_per_s": [round(rate) for rate in transfers],
            "sync_bytes_per_s": [round(rate) for rate in syncs],
            "median_transfer_ratio": statistics.median(transfers) / limit if limit else None,
            "median_sync_ratio": statistics.median(syncs) / limit if limit else None,
        }
    return found


def _rate_row(limit: str, found: dict[str, Any], size: int) -> str:
    transfers = ", ".join(f"{r / 1e6:.2f}" for r in found["transfer_bytes_per_s"])
    syncs = ", ".join(f"{r / 1e6:.2f}" for r in found["sync_bytes_per_s"])
    if limit == "none":
        return f"| no limit, {size / 1e6:.0f} MB | transfers {transfers} MB/s; whole syncs {syncs} MB/s |"
    return (
        f"| `--sync-max-bytes-per-s {limit}`, {size / 1e6:.0f} MB | transfers {transfers} MB/s: median "
        f"**{found['median_transfer_ratio']:.3f}x** the limit; whole syncs (listing, manifest, check) {syncs} MB/s: "
        f"{found['median_sync_ratio']:.3f}x |"
    )


def markdown(report: dict[str, Any]) -> str:
    swap, rate = report["swap"], report["rate_limit"]
    unchanged, v2, replies = swap["unchanged"], swap["version_2"], swap["replies"]
    return "\n".join(
        [
            "# A model kept in object storage (all-MiniLM-L6-v2, moto's S3 server on loopback)",
            "",
            f"CPU: {describe_cpu(report['environment'])}.",
            "",
            f"`bertserve start --model-dir s3://models/minilm --poll-interval-s {swap['poll_interval_s']:.0f} "
            f"--dtype fp32`, {CLIENTS} clients encoding continuously (requests of "
            f"{', '.join(map(str, SIZES))} sentences), each reply checked against the version it names.",
            "",
            "| | |",
            "| --- | --- |",
            f"| unchanged store, per poll | {unchanged['listings_per_poll']:.0f} listing, "
            f"{unchanged['manifest_reads']} manifest reads, {unchanged['files_fetched']} files, "
            f"{unchanged['bytes_fetched']} bytes ({unchanged['polls']} polls) |",
            f"| version 2 uploaded | in {v2['upload_s']:.1f} s |",
            f"| version 2 serving, after its upload ended | **{v2['serving_s_after_upload']:.1f} s** |",
            f"| version 2's sync | {v2['files_fetched']} files fetched ({v2['bytes_fetched'] / 1e6:.1f} MB), "
            f"{v2['files_reused']} linked from version 1 |",
            f"| replies | {replies['ok']} right, **{replies['wrong']} wrong, {replies['failed']} failed** "
            f"(by version: {swap['by_version']}) |",
            f"| version 2 from the store against `--model-dir` on its files (500 sentences, fp32) | min cosine "
            f"{swap['min_cosine_to_model_dir']:.7f}, largest difference "
            f"{swap['max_abs_difference_to_model_dir']:.1e} |",
            *(_rate_row(limit, found, rate["bytes"]) for limit, found in rate["limits"].items()),
            "",
            "Reproduce: `python benchmarks/model_sync.py --json benchmarks/report/model_sync.json "
            "--markdown benchmarks/report/model_sync.md`",
        ]
    )


def main() -> int:
    parser = model_parser(__doc__ or "")
    args = parser.parse_args()
    model_dir = model_dir_or_exit(parser, args.model_dir)
    texts = read_corpus(args.corpus, 2000)
    store, env = start_store()
    try:
        with tempfile.TemporaryDirectory(prefix="bertserve-model-sync-") as tmp:
            work = Path(tmp)
            versions = {1: work / "v1", 2: work / "v2"}
            write_version(model_dir, versions[1])
            write_version(model_dir, versions[2], scale=1.05)
            report = {
                "environment": environment(),
                "swap": swap_under_load(versions, texts, work / "cache", env),
                "rate_limit": rate_limit(work),
            }
    finally:
        store.stop()
    write_report(report, markdown(report), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
