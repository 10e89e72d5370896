"""Self-signed test certificates made with Debian's openssl (tests/helpers)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """(certificate, key) for CN=`name`, valid for 127.0.0.1 and localhost, its own CA."""
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return cert, key
