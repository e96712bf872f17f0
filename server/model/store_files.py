"""Files of a model kept in object storage: the store's URL, its file system, and one file
brought over whole and checked.

A URL names a store and a path in it: ``s3://BUCKET/PREFIX`` (Amazon S3 and every
S3-compatible store: MinIO, Ceph, R2), ``gs://BUCKET/PREFIX``, ``hdfs://NAMENODE/PATH``,
``webhdfs://NAMENODE:PORT/PATH`` or ``https://HOST/PATH``. ``fsspec`` and its maintained
backends read them (``s3fs``, ``gcsfs``, pyarrow's HDFS, WebHDFS, HTTP), each installed with
its extra (``pip install 'bertserve[s3]'``), and each takes its credentials from its own
standard sources: for S3 the AWS environment (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``,
``AWS_ENDPOINT_URL`` for another S3 store), its config files and instance roles; for GCS
``GOOGLE_APPLICATION_CREDENTIALS`` and the metadata server. A URL that holds credentials
itself (``s3://KEY:SECRET@bucket``) is refused: they would show in every log line and
``ps`` listing.

:func:`fetch_file` brings one file over: at most ``--sync-max-bytes-per-s`` on average
(:class:`Pace`), hashed as it arrives, checked against the md5 a store gives (the ETag of a
single-part S3 upload, GCS's ``md5Hash``) and then against its sha256 in the manifest. A
transfer cut off is taken up again where it stopped, after a back-off with jitter, up to
:data:`ATTEMPTS` tries; what cannot be had is a :class:`StoreError` that names the file and
the cause.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import random
import re
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, ModelFileError

logger = logging.getLogger("bertserve.store")

# scheme -> (fsspec protocol, the extra that installs its backend)
BACKENDS = {
    "s3": ("s3", "s3"),
    "s3a": ("s3", "s3"),
    "gs": ("gcs", "gcs"),
    "gcs": ("gcs", "gcs"),
    "hdfs": ("hdfs", "hdfs"),
    "webhdfs": ("webhdfs", "hdfs"),
    "https": ("https", "https"),
    "http": ("http", "https"),
}
_HDFS_PORTS = {"webhdfs": 9870, "hdfs": 8020}  # a namenode's default ports
_SCHEME = re.compile(r"(?P<scheme>[a-z][a-z0-9]*)://")

ATTEMPTS = 5
"""Tries of one file (its transfer taken up where it stopped) before a sync gives up."""
BACKOFF_S = 0.5
"""The first back-off; each next one doubles, up to :data:`BACKOFF_CAP_S`, and waits a random
share of it (full jitter), so servers that lost the store together do not come back together."""
BACKOFF_CAP_S = 20.0
CHUNK_BYTES = 1 << 20
"""Bytes read per request at most (and fewer under a low rate limit, so the pace stays even)."""

CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the instance role (and AWS_ENDPOINT_URL "
    "for a store other than AWS)",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS, or the instance's service account",
    "hdfs": "the Kerberos ticket (kinit) or HADOOP_USER_NAME",
    "webhdfs": "HADOOP_USER_NAME, or a Kerberos ticket",
    "https": "the server's own access rules",
    "http": "the server's own access rules",
}


class StoreError(ModelFileError):
    """A file of the store cannot be had. ``lasting``: trying again will not help (access
    denied, a file missing, a digest that does not match) until the store changes."""

    def __init__(self, message: str, *, lasting: bool, missing: bool = False) -> None:
        super().__init__(message)
        self.lasting = lasting
        self.missing = missing  # the store has no such file or folder


@dataclass(frozen=True)
class StoreUrl:
    """A path in a store: ``scheme://path`` (no trailing ``/``)."""

    scheme: str
    path: str

    @property
    def protocol(self) -> str:
        return BACKENDS[self.scheme][0]

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.path}"

    @property
    def fs_path(self) -> str:
        """The path as the backend takes it: the whole URL where the host is not part of the
        path (HTTP, HDFS), the bucket and key for object stores."""
        return self.url if self.protocol in ("http", "https", "hdfs", "webhdfs") else self.path

    def child(self, *names: str) -> StoreUrl:
        return StoreUrl(self.scheme, "/".join([self.path, *names]))

    def __str__(self) -> str:
        return self.url


def is_store_url(text: str) -> bool:
    """Whether ``text`` names a store (``s3://...``) rather than a directory."""
    match = _SCHEME.match(str(text))
    return match is not None and match["scheme"] in BACKENDS


def parse_store_url(text: str) -> StoreUrl:
    """``text`` as a :class:`StoreUrl`; raises :class:`ConfigError` for a scheme no backend
    reads, a URL with credentials in it, a query or fragment, or no bucket or host."""
    match = _SCHEME.match(text)
    if match is None or match["scheme"] not in BACKENDS:
        raise ConfigError(f"{text!r} is not a store URL: it must start with one of {', '.join(BACKENDS)}://")
    parts = urllib.parse.urlsplit(text)
    if parts.username is not None or parts.password is not None:
        raise ConfigError(
            f"the model URL {parts.scheme}://...@{parts.hostname}{parts.path} holds credentials, which would show in "
            f"logs and process listings: give them as {CREDENTIALS[BACKENDS[match['scheme']][0]]}"
        )
    if parts.query or parts.fragment:
        raise ConfigError(f"the model URL {text} has a query or fragment: name the path alone")
    if not parts.netloc:
        raise ConfigError(f"the model URL {text} names no bucket or host after {match['scheme']}://")
    path = (parts.netloc + parts.path).rstrip("/")
    if any(part in (".", "..") for part in path.split("/")):
        raise ConfigError(f"the model URL {text} has a . or .. in its path: name the path itself")
    return StoreUrl(match["scheme"], path)


def open_store(url: StoreUrl) -> Any:
    """The file system of ``url``'s store (a fresh ``fsspec`` instance, listings never cached);
    raises :class:`ConfigError` naming the extra to install when its backend is missing."""
    import fsspec

    protocol, extra = BACKENDS[url.scheme]
    try:
        kind = fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as exc:
        raise ConfigError(
            f"reading {url.scheme}:// needs its backend: pip install 'bertserve[{extra}]' ({exc})"
        ) from None
    options: dict[str, Any] = {"skip_instance_cache": True}
    if protocol == "s3":
        # one try per request here: fetch_file retries, with back-off, and takes a transfer up where it stopped
        options.update(
            use_listings_cache=False,
            config_kwargs={"connect_timeout": 10, "read_timeout": 60, "retries": {"max_attempts": 1}},
        )
    elif protocol in ("gcs", "http", "https"):
        options.update(use_listings_cache=False)
    elif protocol in _HDFS_PORTS:  # the namenode: WebHDFS's HTTP port, or HDFS's own
        host, _, port = url.path.partition("/")[0].partition(":")
        options.update(host=host, port=int(port) if port.isdigit() else _HDFS_PORTS[protocol])
    try:
        fs = kind(**options)
    except ImportError as exc:
        raise ConfigError(
            f"reading {url.scheme}:// needs its backend: pip install 'bertserve[{extra}]' ({exc})"
        ) from None
    except Exception as exc:  # a backend that cannot start (pyarrow's HDFS without libhdfs, say)
        raise StoreError(
            f"cannot open {url.scheme}://{url.path.partition('/')[0]}: {_cause(exc)}", lasting=True
        ) from exc
    if protocol == "s3":
        fs.retries = 1
    return fs


def store_error(exc: BaseException, url: StoreUrl | str, doing: str) -> StoreError:
    """``exc`` (raised by a backend while ``doing``) as a :class:`StoreError` naming ``url`` and the cause."""
    scheme = str(url).partition("://")[0]
    protocol = BACKENDS.get(scheme, ("", ""))[0]
    if isinstance(exc, StoreError):
        return exc
    if isinstance(exc, PermissionError) or _status(exc) in (401, 403):
        return StoreError(
            f"{doing} {url}: access denied ({_cause(exc)}); the credentials come from "
            f"{CREDENTIALS.get(protocol, 'the backend')}",
            lasting=True,
        )
    if isinstance(exc, FileNotFoundError) or _status(exc) == 404:
        return StoreError(f"{doing} {url}: not found", lasting=True, missing=True)
    return StoreError(f"{doing} {url}: {_cause(exc)}", lasting=False)


def _status(exc: BaseException) -> int | None:
    status = getattr(exc, "status", None) or getattr(exc, "code", None)
    return status if isinstance(status, int) else None


def _cause(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def backoff_s(attempt: int, rng: Callable[[], float] = random.random) -> float:
    """The wait before try ``attempt + 1`` (``attempt`` from 1): full jitter under a doubling cap."""
    return rng() * min(BACKOFF_CAP_S, BACKOFF_S * 2 ** (attempt - 1))


class Pace:
    """A rate limit: at most ``rate`` bytes a second on average since the first byte taken
    (``None``: no limit). A sync's files share one pace."""

    def __init__(
        self,
        rate: float | None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rate = rate
        self.clock = clock
        self.sleep = sleep
        self.started: float | None = None
        self.taken = 0

    @property
    def chunk(self) -> int:
        """Bytes to ask for at once: a quarter second's worth under a limit, within 64 KiB..1 MiB."""
        if not self.rate:
            return CHUNK_BYTES
        return int(min(CHUNK_BYTES, max(1 << 16, self.rate / 4)))

    def take(self, size: int) -> None:
        """Account for ``size`` bytes about to be asked for, sleeping first until they fit the
        limit: with them, no more than ``rate`` bytes a second since the start (no burst)."""
        now = self.clock()
        if self.started is None:
            self.started = now
        self.taken += size
        if self.rate:
            due = self.started + self.taken / self.rate
            if due > now:
                self.sleep(due - now)


@dataclass(frozen=True)
class Fetched:
    """One file brought over: its bytes, the seconds its transfer took (back-offs included),
    the tries it took, and whether a store's md5 was checked too."""

    size: int
    seconds: float
    attempts: int
    md5_checked: bool


def fetch_file(
    fs: Any,
    url: StoreUrl,
    target: str,
    sha256: str,
    pace: Pace,
    *,
    attempts: int = ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> Fetched:
    """Bring ``url`` over to ``target`` and check it against ``sha256``. A transfer cut off
    is taken up where it stopped; a file whose bytes do not match (the store's md5 as it
    arrives, or the sha256 once whole) is fetched once more from the start, in case it was
    damaged on the way, and then refused. Raises :class:`StoreError` naming the file."""
    os.makedirs(os.path.dirname(target), exist_ok=True)
    started = time.monotonic()
    partial = target + ".part"
    done, mismatches = 0, 0
    digests = (hashlib.sha256(), hashlib.md5(usedforsecurity=False))
    expected_md5: str | None = None
    for attempt in range(1, attempts + 1):
        try:
            with open(partial, "ab" if done else "wb") as out, fs.open(url.fs_path, "rb", block_size=pace.chunk) as f:
                expected_md5 = _md5_of(getattr(f, "details", None) or {})
                if done:
                    f.seek(done)
                size = getattr(f, "size", None)  # unknown for some HTTP servers: read until nothing comes
                while size is None or done < size:
                    want = pace.chunk if size is None else min(pace.chunk, size - done)
                    pace.take(want)
                    data = f.read(want)
                    if not data:
                        break
                    out.write(data)
                    for digest in digests:
                        digest.update(data)
                    done += len(data)
        except Exception as exc:  # the backends raise their own kinds: each is judged by store_error
            error = store_error(exc, url, "reading")
            if error.lasting or attempt == attempts:
                _remove(partial)
                raise error from exc
            wait = backoff_s(attempt)
            logger.warning("model sync: %s; %d bytes in, trying again in %.1f s", error, done, wait)
            sleep(wait)
            continue
        problem, lasting = _mismatch(digests, sha256, expected_md5)
        if problem is None:
            os.replace(partial, target)
            return Fetched(done, time.monotonic() - started, attempt, expected_md5 is not None)
        mismatches += 1
        if lasting or mismatches >= 2 or attempt == attempts:
            _remove(partial)
            raise StoreError(f"{url} {problem}", lasting=True)
        logger.warning("model sync: %s %s; fetching it once more", url, problem)
        done, digests = 0, (hashlib.sha256(), hashlib.md5(usedforsecurity=False))
    raise AssertionError("unreachable")  # pragma: no cover


def _mismatch(digests: tuple[Any, Any], sha256: str, md5: str | None) -> tuple[str | None, bool]:
    """What is wrong with the bytes that arrived (``None``: nothing), and whether fetching
    them again cannot help: when they match the store's own md5, the object itself is not
    the one the manifest lists. An md5 that differs while the sha256 matches was no md5 (an
    S3 object encrypted with KMS has another kind of ETag), and the file is taken."""
    got = digests[0].hexdigest()
    if got == sha256:
        return None, False
    listed = f"its sha256 is {got[:16]}..., and the manifest says {sha256[:16]}..."
    if md5 is not None and digests[1].hexdigest() == md5:
        return f"does not match the manifest: {listed} (it arrived whole: the store's own md5 matches)", True
    if md5 is not None:
        return f"arrived damaged: {listed}, and its md5 is not the store's {md5}", False
    return f"does not match the manifest: {listed}", False


def _md5_of(details: dict[str, Any]) -> str | None:
    """The md5 a store gives for an object, where it is one: the ETag of a single-part S3
    upload (a multipart one ends in ``-N``), GCS's base64 ``md5Hash``."""
    etag = str(details.get("ETag") or details.get("etag") or "").strip('"').lower()
    if re.fullmatch(r"[0-9a-f]{32}", etag):
        return etag
    md5_hash = details.get("md5Hash")
    if isinstance(md5_hash, str):
        try:
            raw = base64.b64decode(md5_hash, validate=True)
        except ValueError:
            return None
        return raw.hex() if len(raw) == 16 else None
    return None


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.remove(path)
