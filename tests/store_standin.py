"""An S3 store on loopback for the tests: ``moto``'s server (the S3 protocol, ETags and all,
answering boto3, s3fs and the server's processes alike), and a proxy in front of it that cuts
or slows what goes through.

``S3Standin.env`` is what a process needs to reach it: the endpoint in ``AWS_ENDPOINT_URL``
and throwaway credentials, as a user sets them for MinIO or any S3-compatible store.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertserve.server.model.checksum import MANIFEST, model_files, write_manifest

BUCKET = "models"


class S3Standin:
    """``moto``'s S3 server on 127.0.0.1, with one bucket; stopped and started again on the
    same port (a store that goes down, and comes back)."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
        self.server.start()
        self.host, self.port = self.server.get_host_and_port()
        self.endpoint = f"http://{self.host}:{self.port}"
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "bertserve-tests",
            "AWS_SECRET_ACCESS_KEY": "bertserve-tests-secret",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        self.s3 = self.client()
        self.s3.create_bucket(Bucket=BUCKET)

    def client(self, endpoint: str | None = None) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=endpoint or self.endpoint,
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )

    def upload(
        self, prefix: str, source: str, *, manifest: bool = True, rotten: dict[str, bytes] | None = None
    ) -> list[str]:
        """Upload the files of ``source`` under ``prefix/`` (its manifest written first, and
        uploaded last, as a careful uploader does); the keys, manifest last. A file named in
        ``rotten`` goes up as those bytes instead, while the manifest lists the good ones."""
        if manifest:
            write_manifest(source)
        rels = [rel.replace(os.sep, "/") for rel in model_files(source)] + ([MANIFEST] if manifest else [])
        for rel in rels:
            if rotten and rel in rotten:
                self.put(f"{prefix}/{rel}", rotten[rel])
            else:
                self.s3.upload_file(os.path.join(source, *rel.split("/")), BUCKET, f"{prefix}/{rel}")
        return [f"{prefix}/{rel}" for rel in rels]

    def put(self, key: str, body: bytes) -> None:
        self.s3.put_object(Bucket=BUCKET, Key=key, Body=body)

    def get(self, key: str) -> bytes:
        return bytes(self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())

    def stop(self) -> None:
        self.server.stop()

    def start(self) -> None:
        """Start again on the same port (the objects are kept: moto's state is the process's)."""
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address=self.host, port=self.port, verbose=False)
        self.server.start()


@contextmanager
def s3_env(standin: S3Standin, endpoint: str | None = None) -> Iterator[None]:
    """This process's environment pointed at ``standin`` (or at ``endpoint``: a proxy)."""
    saved = {key: os.environ.get(key) for key in standin.env}
    os.environ.update({**standin.env, **({"AWS_ENDPOINT_URL": endpoint} if endpoint else {})})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class CuttingProxy:
    """A TCP proxy on 127.0.0.1 in front of ``target``: each connection is relayed, except
    that the answer to the first request whose line contains ``cut_path`` is cut after
    ``cut_after`` bytes (the connection closed), ``cuts`` times."""

    def __init__(self, target: tuple[str, int], cut_path: str = "", cut_after: int = 0, cuts: int = 1) -> None:
        self.target = target
        self.cut_path, self.cut_after, self.cuts = cut_path.encode(), cut_after, cuts
        self.cut = 0
        self.requests: list[bytes] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._stop.set()
        self.listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.target)
        cutting = threading.Event()
        base = [0]  # the bytes relayed before the answer to cut

        def up() -> None:
            try:
                while data := client.recv(65536):
                    line = data.split(b"\r\n", 1)[0]
                    if line[:4] in (b"GET ", b"HEAD", b"PUT ", b"POST"):
                        self.requests.append(line)
                        with self._lock:
                            if (
                                self.cut_path
                                and self.cut_path in line
                                and line.startswith(b"GET ")
                                and self.cut < self.cuts
                            ):
                                self.cut += 1
                                base[0] = -1
                                cutting.set()
                    upstream.sendall(data)
            except OSError:
                pass

        threading.Thread(target=up, daemon=True).start()
        sent = 0
        try:
            while data := upstream.recv(65536):
                if cutting.is_set():
                    if base[0] < 0:
                        base[0] = sent
                    room = base[0] + self.cut_after - sent
                    if room <= len(data):
                        client.sendall(data[: max(room, 0)])
                        break
                client.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            for sock in (client, upstream):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


@dataclass(frozen=True)
class StrictS3:
    """moto's S3 server with IAM on: it checks each request's signature against its users."""

    endpoint: str
    good: dict[str, str]  # a user's AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, allowed s3:*

    def env(self, **changes: str) -> dict[str, str]:
        """The environment a process reaches it with: the good key, unless ``changes`` say otherwise."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
            **self.good,
            **changes,
        }


@contextmanager
def strict_s3(source: str, prefix: str) -> Iterator[StrictS3]:
    """A moto server of its own (IAM applies to a whole process) on 127.0.0.1, with one user
    allowed everything, and ``source``'s files under ``prefix/`` with their manifest."""
    import boto3

    port = _free_port()
    # the first four requests (the user, its policy, its key, the bucket) are made before IAM applies
    env = dict(os.environ, INITIAL_NO_AUTH_ACTION_COUNT="4")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        _wait_listening(port)
        admin = {"endpoint_url": endpoint, "region_name": "us-east-1"}
        iam = boto3.client("iam", aws_access_key_id="admin", aws_secret_access_key="admin", **admin)
        iam.create_user(UserName="reader")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam.put_user_policy(UserName="reader", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        good = {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        s3 = boto3.client(
            "s3",
            aws_access_key_id=good["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=good["AWS_SECRET_ACCESS_KEY"],
            **admin,
        )
        s3.create_bucket(Bucket=BUCKET)
        write_manifest(source)
        for rel in [rel.replace(os.sep, "/") for rel in model_files(source)] + [MANIFEST]:
            s3.upload_file(os.path.join(source, *rel.split("/")), BUCKET, f"{prefix}/{rel}")
        yield StrictS3(endpoint, good)
    finally:
        server.kill()
        server.wait()


def _wait_listening(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"moto's server did not listen on {port}")


def settle_mtimes(directory: Path) -> None:
    past = time.time() - 60
    for path in directory.rglob("*"):
        os.utime(path, (past, past))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
