"""TLS for both frontends from one certificate and key (PEM files), optionally mutual."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dlscale.errors import ConfigError


@dataclass(frozen=True)
class TlsFiles:
    """The server's certificate chain and key; with `client_ca`, clients must show a certificate
    that authority signed (mutual TLS)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def _read(self, path: Path, what: str) -> bytes:
        try:
            return path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"TLS {what} {path} cannot be read: {exc.strerror}") from None

    def server_context(self) -> ssl.SSLContext:
        """The REST frontend's context: TLS 1.2 or newer, the standard library's safe defaults."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert, self.key)
            if self.client_ca is not None:
                context.load_verify_locations(cafile=self.client_ca)
                context.verify_mode = ssl.CERT_REQUIRED
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"TLS certificate {self.cert} or key {self.key}: {exc}") from None
        return context

    def grpc_credentials(self) -> Any:
        """The gRPC frontend's server credentials."""
        import grpc

        pair = (self._read(self.key, "key"), self._read(self.cert, "certificate"))
        root = self._read(self.client_ca, "client CA") if self.client_ca else None
        return grpc.ssl_server_credentials(
            [pair], root_certificates=root, require_client_auth=root is not None
        )
