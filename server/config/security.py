"""Who may use the server: CURVE's keys, who may stop it, and the HTTP API's keys."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class Security:
    """The server's security options (their flags' names), checked when built; that HTTP under
    CURVE needs a key is the server's check, as it needs the ports too."""

    curve_dir: str | None = None  # DIR/server.key_secret; client keys in DIR/clients, admins in DIR/admins
    allow_terminate: bool | None = None  # None: on loopback without CURVE, or admins
    api_key: str | None = dataclasses.field(default=None, repr=False)
    api_keys: str | None = None  # a file of NAME KEY lines: the HTTP principals (server/http/principals.py)

    def __post_init__(self) -> None:
        if self.api_key is not None and len(self.api_key.strip()) < 8:
            raise ConfigError("api_key must be at least 8 characters")
        if self.curve_dir is not None:
            object.__setattr__(self, "curve_dir", os.fspath(self.curve_dir))

    @property
    def http_keyed(self) -> bool:
        """Whether HTTP callers must send a key (``api_key`` or ``api_keys``)."""
        return self.api_key is not None or self.api_keys is not None


@dataclass(frozen=True, kw_only=True)
class Legacy:
    """bert-as-service 1.x's own client, answered in its wire format."""

    legacy_clients: bool = True  # answer bert-as-service 1.x's client in its own wire format
    show_tokens_to_client: bool = False  # legacy clients get each input's tokens with its vectors
