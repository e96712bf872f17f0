"""A stand-in for the Hugging Face Hub on 127.0.0.1, for tests that cannot reach the real one.

It answers the requests ``huggingface_hub`` makes to download a model, as the Hub answers them:

- ``GET /api/models/{repo}[/revision/{rev}]``: the model's info (``sha``, ``siblings``);
- ``GET /api/models/{repo}/tree/{rev}``: the files, with their git and LFS ids;
- ``HEAD`` and ``GET /{repo}/resolve/{rev}/{path}``: a file, with ``X-Repo-Commit``, ``ETag``
  (``X-Linked-Etag`` and ``X-Linked-Size`` for the LFS ones) and ``Content-Length``;
- errors with the Hub's ``X-Error-Code``: ``RepoNotFound`` (401 without a token, as the Hub
  answers, 404 with one), ``RevisionNotFound``, ``EntryNotFound``, ``GatedRepo`` (401).

A repository is a directory's files at one commit, under ``main`` and any other names given.
Faults are set per repository: ``gated`` (the files need the token), ``missing`` (files listed
but answered 404) and ``cut`` (files whose body stops half way: the connection closes). Every
request is recorded in :attr:`HubStandIn.requests`, so a test can tell that none was made.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

_LFS = (".safetensors", ".bin", ".h5", ".onnx", ".msgpack")  # files the Hub keeps in LFS


@dataclass
class Repo:
    files: dict[str, bytes]
    revisions: dict[str, str] = field(default_factory=dict)  # branch or tag -> commit
    gated: bool = False
    token: str = "hf_standin_token"
    missing: set[str] = field(default_factory=set)
    cut: set[str] = field(default_factory=set)

    @property
    def commit(self) -> str:
        digest = hashlib.sha1()
        for path in sorted(self.files):
            digest.update(path.encode() + b"\0" + hashlib.sha1(self.files[path]).digest())
        return digest.hexdigest()

    def resolve(self, revision: str) -> str | None:
        if revision in (self.commit, "main"):
            return self.commit
        return self.revisions.get(revision)


def read_directory(directory: str) -> dict[str, bytes]:
    """Every file under ``directory``, by its ``/`` path relative to it."""
    files = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                files[os.path.relpath(path, directory).replace(os.sep, "/")] = f.read()
    return files


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubStandIn:
    """The stand-in, serving on a free port from :meth:`start` to :meth:`stop`."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def add(self, repo_id: str, files: dict[str, bytes], **faults: Any) -> Repo:
        self.repos[repo_id] = Repo(dict(files), **faults)
        return self.repos[repo_id]

    @property
    def url(self) -> str:
        assert self._server is not None, "the stand-in is not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> HubStandIn:
        standin = self

        class Handler(_Handler):
            hub = standin

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="hub-standin", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> HubStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandIn
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the test says what matters
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    # -- routing ---------------------------------------------------------------------------

    def _answer(self, *, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub.requests.append((self.command, path))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            self._api(parts[2:], body=body)
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._file("/".join(parts[:2]), parts[3], "/".join(parts[4:]), body=body)
        else:
            self._error(404, "", "not a route of this stand-in")

    def _repo(self, repo_id: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            token = self.headers.get("Authorization") is not None
            self._error(404 if token else 401, "RepoNotFound", "Repository not found")
        return repo

    def _api(self, parts: list[str], *, body: bool) -> None:
        repo = self._repo("/".join(parts[:2]))
        if repo is None:
            return
        rest = parts[2:]
        revision = rest[1] if len(rest) >= 2 else "main"
        commit = repo.resolve(revision)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        elif not rest or rest[0] == "revision":
            info = {
                "id": "/".join(parts[:2]),
                "modelId": "/".join(parts[:2]),
                "sha": commit,
                "private": False,
                "gated": "auto" if repo.gated else False,
                "siblings": [{"rfilename": name} for name in sorted(repo.files)],
            }
            self._json(info, body=body)
        elif rest[0] == "tree":
            self._json(self._tree(repo), body=body)
        else:
            self._error(404, "", "not a route of this stand-in")

    def _tree(self, repo: Repo) -> list[dict[str, Any]]:
        entries: list[dict[str, Any]] = []
        folders = sorted({path.rsplit("/", 1)[0] for path in repo.files if "/" in path})
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": folder} for folder in folders]
        for path, data in sorted(repo.files.items()):
            entry: dict[str, Any] = {"type": "file", "oid": _git_oid(data), "size": len(data), "path": path}
            if path.endswith(_LFS):
                entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
            entries.append(entry)
        return entries

    def _file(self, repo_id: str, revision: str, path: str, *, body: bool) -> None:
        repo = self._repo(repo_id)
        if repo is None:
            return
        if repo.gated and self.headers.get("Authorization") != f"Bearer {repo.token}":
            self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. Please log in.")
            return
        commit = repo.resolve(revision)
        if commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return
        data = repo.files.get(path)
        if data is None or path in repo.missing:
            self._error(404, "EntryNotFound", f"{path} does not exist on {revision}", commit=commit)
            return
        self.send_response(200)
        self.send_header("X-Repo-Commit", commit)
        if path.endswith(_LFS):
            self.send_header("X-Linked-Etag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("X-Linked-Size", str(len(data)))
        self.send_header("ETag", f'"{_git_oid(data)}"')
        if body and path in repo.cut:  # the body stops half way, and the connection closes
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    # -- answers ---------------------------------------------------------------------------

    def _json(self, value: Any, *, body: bool) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit is not None:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
