"""The shell and Python examples of README.md and docs/*.md, read and run as a reader would
(tests/integration/test_doc_examples.py says which run, against what, and which do not).

* :func:`read_blocks` finds every fenced block, with its page, line and language.
* :func:`make_fresh_venv` makes a venv with the checkout installed in it by pip, as a user's
  ``pip install .`` would, and bertserve's dependencies taken from the test's own venv.
* :func:`point_at` rewrites an example's ports (5555, 5556, 8080, 5557, 50051) to free ones.
* :class:`Server` is one ``bertserve start`` line of a page, run in the background.
* :class:`ShapedHashingModel` is ``HashingModel`` with all-MiniLM-L6-v2's 384 dimensions,
  which serves an embedding model where an example's point is not the model's numbers.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from bertserve.server.model.interface import HashingModel
from bertserve.server.model.tokenization import TokenizedBatch

SHELL = frozenset({"bash", "sh", "shell", "console"})
PYTHON = frozenset({"python", "py"})
NOT_COMMANDS = frozenset({"text", "yaml", "json", "toml", "ini"})  # what a command prints, or a file's lines
STAND_IN = f"{Path(__file__).stem}:ShapedHashingModel"  # --model-class, with tests/ on PYTHONPATH


class ShapedHashingModel(HashingModel):
    """``HashingModel`` with 384 dimensions, which cuts on the left too: what an example asks of
    all-MiniLM-L6-v2 (``dimensions=128``, 48 bytes of ``ubinary``, ``truncation_direction``)
    holds, with no TensorFlow in the worker."""

    def __init__(self, config: Any = None) -> None:
        super().__init__(config, dim=384)

    def tokenize(
        self,
        texts: Sequence[Any],
        *,
        is_tokenized: bool = False,
        keep_tokens: bool = False,
        truncation_direction: str = "right",
    ) -> TokenizedBatch:
        if truncation_direction == "left":  # the last words that fit, as HashingModel keeps the first
            limit = self.max_seq_len - 2
            words = [list(text) if is_tokenized else str(text).split() for text in texts]
            kept = [w[-limit:] if is_tokenized else " ".join(w[-limit:]) for w in words]
            batch = super().tokenize(kept, is_tokenized=is_tokenized, keep_tokens=keep_tokens)
            batch.truncated = np.asarray([len(w) > limit for w in words], bool)
            return batch
        return super().tokenize(texts, is_tokenized=is_tokenized, keep_tokens=keep_tokens)


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository: README.md, docs/client.md
    line: int  # of the opening fence
    lang: str  # the fence's language, lower case; "" when it names none
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def continues(self) -> bool:
        """A Python block that starts with anything but an import goes on from the page's
        Python block before it (``client.embeddings.create(...)`` after ``client = OpenAI(...)``)."""
        for line in self.code.splitlines():
            if line.strip() and not line.lstrip().startswith("#"):
                return not line.startswith(("import ", "from "))
        return False


_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`]*)$")


def pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def read_blocks(root: Path) -> list[Block]:
    """Every fenced block of the pages, in page order and then in order of lines."""
    found = []
    for page in pages(root):
        lines = page.read_text(encoding="utf-8").splitlines()
        index = 0
        while index < len(lines):
            opening = _FENCE.match(lines[index])
            if opening is None:
                index += 1
                continue
            indent, info = opening["indent"], opening["info"].strip()
            end = index + 1
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            code = "\n".join(line.removeprefix(indent) for line in lines[index + 1 : end]) + "\n"
            lang = info.split()[0].lower() if info else ""
            found.append(Block(page.relative_to(root).as_posix(), index + 1, lang, code))
            index = end + 1
    return found


def console_commands(code: str) -> str:
    """The commands of a console block: its ``$ `` lines and their continuations, not the output."""
    commands, going_on = [], False
    for line in code.splitlines():
        if line.startswith("$ ") or going_on:
            commands.append(line.removeprefix("$ "))
            going_on = line.rstrip().endswith("\\")
    return "\n".join(commands) + "\n"


def logical_lines(code: str) -> list[str]:
    """The shell lines of ``code``, a line ending in ``\\`` joined to the next (as written)."""
    joined, current = [], ""
    for line in code.splitlines():
        current += line
        if line.rstrip().endswith("\\"):
            current += "\n"
            continue
        joined.append(current)
        current = ""
    if current:
        joined.append(current)
    return joined


_START = re.compile(r"^(?:\w+=\S+\s+)*bertserve start\b")


def shell_parts(code: str) -> list[tuple[str, str]]:
    """``code`` cut around each ``bertserve start``: ``("shell", text)`` and ``("start",
    command)`` in order. What comes before a start on its line (``pip install ... && bertserve
    start``) goes with the shell before it."""
    parts: list[tuple[str, str]] = []
    shell: list[str] = []
    for line in logical_lines(code):
        commands = line.split(" && ")
        if not _START.match(commands[-1].strip()):
            shell.append(line)
            continue
        if commands[:-1]:
            shell.append(" && ".join(commands[:-1]))
        if any(text.strip() and not text.lstrip().startswith("#") for text in shell):
            parts.append(("shell", "\n".join(shell) + "\n"))
        shell = []
        parts.append(("start", commands[-1].strip()))
    if any(text.strip() and not text.lstrip().startswith("#") for text in shell):
        parts.append(("shell", "\n".join(shell) + "\n"))
    return parts


def same_command(command: str) -> str:
    """``command`` with its line breaks and runs of spaces as one space: two pages that wrap
    the same ``bertserve start`` differently start the same server."""
    return re.sub(r"\s*\\\n\s*|\s+", " ", command).strip()


# -- ports -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ports:
    """Where a server of the run listens; the pages say 5555 (and 5556), 8080, 5557 and 50051."""

    zmq: int  # requests; replies on zmq + 1
    http: int
    worker: int
    grpc: int


_CLIENT = r"\b((?:Async|Concurrent)?BertClient)\("
_STRING = r"\"[^\"]*\"|'[^']*'"


def point_at(code: str, ports: Ports) -> str:
    """``code`` with the pages' ports replaced by ``ports``: the numbers where they are
    written, and ``port=`` given to a client constructor that leaves the port to its default
    (``BertClient()``, ``BertClient("localhost", server_key=...)``). ``--bind 0.0.0.0``
    becomes loopback: the run listens on no other interface."""
    code = re.sub(r"\b5555\b", str(ports.zmq), code)
    code = re.sub(r"\b5556\b", str(ports.zmq + 1), code)
    code = re.sub(r"\b8080\b", str(ports.http), code)
    code = re.sub(r"\b5557\b", str(ports.worker), code)
    code = re.sub(r"\b50051\b", str(ports.grpc), code)
    code = code.replace("--bind 0.0.0.0", "--bind 127.0.0.1")
    # a host given and no port after it: the port goes after the host
    code = re.sub(_CLIENT + rf"(\s*(?:{_STRING}))\s*(?=\)|,\s*[A-Za-z_])", rf"\1(\2, port={ports.zmq}", code)
    # nothing positional: the port goes first
    return re.sub(_CLIENT + rf"(?!\s*(?:{_STRING}|\d))", rf"\1(port={ports.zmq}, ", code)


# -- the reader's venv -------------------------------------------------------------------


_NOT_SOURCES = {".git", ".venv", "build", "dist", "site", "tests", "benchmarks", "docs", "docker"}


def _not_sources(root: Path) -> Callable[[str, list[str]], set[str]]:
    """What a copy of the checkout at ``root`` leaves out: at its root the folders no package
    is built from, and everywhere what a build or a run left."""

    def left_out(folder: str, names: list[str]) -> set[str]:
        left = {name for name in names if name.endswith((".egg-info", ".pyc")) or name == "__pycache__"}
        left |= {name for name in names if name.startswith(".") and name.endswith("_cache")}
        return left | (_NOT_SOURCES & set(names) if Path(folder) == root else set())

    return left_out


def make_fresh_venv(root: Path, where: Path) -> Path:
    """A venv at ``where/venv`` with the checkout installed as ``pip install .`` installs it
    (a wheel built from a copy of the sources, so the checkout gets no build/ folder), its
    ``bertserve`` console script in its ``bin``; returns that ``bin``.

    Its dependencies are this venv's: a ``.pth`` line puts this venv's site-packages on its
    path, behind its own (a plain path: the ``.pth`` files there, this venv's editable
    install of bertserve among them, are not read). So it proves what the checkout installs
    (packages, package data, the entry point) and that the examples run with it, not that
    ``setup.py``'s requirements resolve from the package index."""
    source = where / "source"
    shutil.copytree(root, source, ignore=_not_sources(root))
    venv = where / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(purelib, "test-venv-dependencies.pth").write_text("".join(f"{path}\n" for path in sorted(ours)))
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps"]
    done = subprocess.run([*pip, "--no-build-isolation", "--no-index", str(source)], capture_output=True, text=True)
    assert done.returncode == 0, f"pip could not install the checkout:\n{done.stdout}{done.stderr}"
    return venv / "bin"


# -- a page's server -----------------------------------------------------------------------


@dataclass
class Server:
    """One ``bertserve start`` command, run by bash in its own session (as from a terminal)."""

    command: str
    ports: Ports
    process: subprocess.Popen[str]
    output: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=400))
    ready: threading.Event = field(default_factory=threading.Event)
    said_error: threading.Event = field(default_factory=threading.Event)
    interrupted: bool = False

    @classmethod
    def start(cls, command: str, ports: Ports, env: dict[str, str], cwd: Path) -> Server:
        process = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", command],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
        server = cls(command, ports, process)
        threading.Thread(target=server._read, daemon=True).start()
        return server

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            if line.startswith("bertserve") and " ready: " in line:
                self.ready.set()
            elif line.startswith("bertserve: error:") and not self.ready.is_set():
                self.said_error.set()

    def tail(self, lines: int = 40) -> str:
        return "".join(list(self.output)[-lines:])

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.1):
            if self.said_error.is_set() or self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"`{self.command}` did not get ready:\n{self.tail()}")

    def wait_exited(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"`{self.command}` was still running {timeout:.0f} s later:\n{self.tail()}") from None

    def interrupt(self) -> None:
        """Ctrl-C, as a terminal sends it: SIGINT to its session (once: a second one would
        fail what is in flight and stop at once)."""
        if not self.interrupted:
            self.interrupted = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGINT)

    def wait_stopped(self, timeout: float = 60) -> None:
        """Wait for it to stop, then SIGKILL what is left of its session."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)
            time.sleep(0.2)  # the session's other processes, if any, are on their way out
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        self.interrupt()
        self.wait_stopped()


def read_env(path: Path) -> dict[str, str]:
    """The environment a shell wrote with ``env -0``."""
    pairs = (item.partition("=") for item in path.read_text().split("\0") if "=" in item)
    return {name: value for name, _, value in pairs}
