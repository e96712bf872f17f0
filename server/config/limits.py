"""What the head holds: inputs queued in all and per client, inputs in one request, the bytes
of the texts queued and of one request frame, and how long a request may wait.

Built once from the flags, which may leave out any of the three
sentence bounds: each left out takes its default, moved as far as the bounds given need, so
that a request fits a client's queue and a client's queue the server's. The scheduler and
admission take these values, not the server's whole config.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

MAX_MESSAGE_BYTES = 64 * 1024 * 1024
"""The largest request frame ``--max-message-bytes`` may allow."""
MESSAGE_BYTES = 16 * 1024 * 1024
"""Default largest request frame: larger requests are better sent as several. ZeroMQ reads a
frame whole before the ventilator sees it, one per connection at a time, so this bounds what a
flood of large frames can make the head hold (docker/README.md)."""
QUEUED_BYTES = 128 * 1024 * 1024
"""Default bound on the memory the texts of admitted requests hold in the head
(``--max-queued-bytes``): with the HTTP budget and the idle head, within a 1 GiB limit."""
REQUEST_TOKENS = 2 * 1024 * 1024
"""Default most tokens of model work in one HTTP request (``--max-request-tokens``), counted
before anything is tokenized: each input at most the model's length, and at most its UTF-8
bytes and the model's special tokens (:mod:`..serving.policy.costs`)."""
REPLY_BYTES = 32 * 1024 * 1024
"""Default largest answer (``--max-reply-bytes``): the vectors as the workers and the sink hold
them, and an HTTP answer as JSON. An answer costs the process that writes it about twice its
size, so this keeps every process within 64 MiB a request."""
QUEUED_SENTENCES = 500_000
CLIENT_QUEUED_SENTENCES = 200_000
REQUEST_SIZE = 100_000

_FLAGS = {
    "queued": "--max-queued-sentences",
    "client": "--max-client-queued-sentences",
    "request": "--max-request-size",
}


@dataclass(frozen=True, kw_only=True)
class Limits:
    """The head's bounds (their flags' names), checked when built. The three sentence bounds
    left out follow those given, so once built each is an int (:attr:`queued_sentences`,
    :attr:`client_queued_sentences`, :attr:`request_size`)."""

    max_request_size: int | None = None  # None: REQUEST_SIZE, at most max_client_queued_sentences
    max_text_chars: int = 100_000  # most characters in one input
    max_request_tokens: int = REQUEST_TOKENS  # most tokens of model work in one HTTP request, counted before work
    max_reply_bytes: int = REPLY_BYTES  # largest answer, counted before any of its work runs
    request_timeout_ms: int = 600_000
    max_queued_sentences: int | None = None  # None: QUEUED_SENTENCES, at least the two below
    max_client_queued_sentences: int | None = None  # None: CLIENT_QUEUED_SENTENCES, within the two around it
    max_queued_bytes: int = QUEUED_BYTES  # most bytes the texts of admitted requests hold
    max_message_bytes: int | None = None  # None: what the size limits need (message_bytes)
    reply_hwm: int = 100  # replies queued for one client connection

    def __post_init__(self) -> None:
        queued, client, request = _follow_bounds(
            self.max_queued_sentences, self.max_client_queued_sentences, self.max_request_size
        )
        given, queued_bytes = self.max_message_bytes, self.max_queued_bytes
        checks = [
            (self.max_text_chars >= 1, "max_text_chars must be at least 1"),
            (self.request_timeout_ms >= 1, "request_timeout_ms must be at least 1"),
            (
                self.max_request_tokens >= 1,
                f"--max-request-tokens must be at least 1, not {self.max_request_tokens}",
            ),
            (self.max_reply_bytes >= 1024, f"--max-reply-bytes must be at least 1024, not {self.max_reply_bytes}"),
            (
                given is None or 1024 <= given <= MAX_MESSAGE_BYTES,
                f"--max-message-bytes must be between 1024 and {MAX_MESSAGE_BYTES}, not {given}",
            ),
            (
                queued_bytes >= 1024 * 1024,
                f"--max-queued-bytes must be at least 1 MiB (1048576), not {queued_bytes}",
            ),
            (
                given is None or given <= queued_bytes,
                f"--max-message-bytes {given} is more than --max-queued-bytes {queued_bytes}: a "
                "request that large could never be queued; lower --max-message-bytes or raise --max-queued-bytes",
            ),
            (self.reply_hwm >= 1, "reply_hwm must be at least 1"),
        ]
        for ok, problem in checks:
            if not ok:
                raise ConfigError(problem)
        object.__setattr__(self, "max_queued_sentences", queued)
        object.__setattr__(self, "max_client_queued_sentences", client)
        object.__setattr__(self, "max_request_size", request)

    @property
    def queued_sentences(self) -> int:
        """Most inputs queued at once, all clients together (``max_queued_sentences``, resolved)."""
        assert self.max_queued_sentences is not None  # __post_init__ fills it in
        return self.max_queued_sentences

    @property
    def client_queued_sentences(self) -> int:
        """Most inputs one client may have queued (``max_client_queued_sentences``, resolved)."""
        assert self.max_client_queued_sentences is not None
        return self.max_client_queued_sentences

    @property
    def request_size(self) -> int:
        """Most inputs in one request (``max_request_size``, resolved)."""
        assert self.max_request_size is not None
        return self.max_request_size

    @property
    def message_bytes(self) -> int:
        """Largest frame the request socket accepts (ZeroMQ's MAXMSGSIZE): ``max_message_bytes``,
        or what the largest allowed request can take as UTF-8 JSON, at most
        :data:`MESSAGE_BYTES` and ``max_queued_bytes``."""
        if self.max_message_bytes is not None:
            return self.max_message_bytes
        per_text = 4 * self.max_text_chars + 8  # UTF-8 bytes, quotes and comma
        return min(MESSAGE_BYTES, self.max_queued_bytes, self.request_size * per_text + 65_536)


def _follow_bounds(queued: int | None, client: int | None, request: int | None) -> tuple[int, int, int]:
    """The sentence bounds, those left out fitted to those given: a request at most a client's
    queue, a client's queue at most the server's. Each left out takes its default, moved as far
    as the bounds given need (``--max-queued-sentences 2000`` alone lowers the other two to
    2000; ``--max-request-size 300000`` alone raises the queues to it). Only bounds given that
    contradict each other are an error, naming both flags."""
    given = {"queued": queued, "client": client, "request": request}
    for key, value in given.items():
        if value is not None and value < 1:
            raise ConfigError(f"{_FLAGS[key]} must be at least 1, not {value}")
    for low, high in (("request", "client"), ("client", "queued"), ("request", "queued")):
        small, large = given[low], given[high]
        if small is not None and large is not None and small > large:
            why = (
                "a request that large could never queue"
                if low == "request"
                else "one client cannot queue more than the whole server"
            )
            lower, higher = _FLAGS[low], _FLAGS[high]
            raise ConfigError(f"{lower} {small} is more than {higher} {large}: {why}; lower {lower} or raise {higher}")
    request_given, client_given = request or 0, client or 0
    queued = queued or max(QUEUED_SENTENCES, client_given, request_given)
    client = client or max(min(CLIENT_QUEUED_SENTENCES, queued), request_given)
    request = request or min(REQUEST_SIZE, client)
    return queued, client, request
