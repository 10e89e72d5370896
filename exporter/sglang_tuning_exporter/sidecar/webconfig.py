"""`--web.config.file`: the exporter-toolkit web configuration (TLS, basic auth, headers) and gzip.

The file format is the one node_exporter and the official exporters accept; the subset served here
is TLS (cert/key files, client CA with client_auth_type, min/max version), `basic_auth_users` with
bcrypt hashes and `http_server_config.headers`. Anything else is an error naming the key.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import hmac
import logging
import re
import ssl
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bcrypt
import yaml

from sglang_tuning_exporter.core import yamltext
from sglang_tuning_exporter.core.problems import ProblemsError
from sglang_tuning_exporter.sidecar.httpserver import BoundedHTTPServer

log = logging.getLogger("sglang_tuning_exporter.sidecar.web")

TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# Python's ssl cannot ask for a certificate without verifying it, so the two unverified toolkit
# policies are refused rather than silently made stricter or looser.
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
_UNVERIFIED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
# The headers the toolkit lets a file set (it refuses others too).
ALLOWED_HEADERS = ("Strict-Transport-Security", "X-Content-Type-Options", "X-Frame-Options", "X-XSS-Protection",
                   "Content-Security-Policy")
_TOP_KEYS = ("tls_server_config", "basic_auth_users", "http_server_config")
_TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
             "prefer_server_cipher_suites")
_HTTP_KEYS = ("headers", "http2")
# Toolkit keys we know but do not implement: named as unsupported, not as unknown.
_UNSUPPORTED = {"rate_limit": "rate limiting", "cert": "inline certificates (use cert_file)",
                "key": "inline keys (use key_file)", "client_ca": "inline client CAs (use client_ca_file)",
                "client_allowed_sans": "client SAN allow-lists", "cipher_suites": "cipher suite lists",
                "curve_preferences": "curve preferences"}
_BCRYPT_RE = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}$")
GZIP_LEVEL = 5  # most of level 9's ratio on exposition text at a fraction of the CPU


class WebConfigError(ProblemsError):
    """Invalid web configuration file; `problems` lists every one."""

    what = "web configuration"


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """What the HTTPS listener needs; paths already resolved against the file's directory."""

    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    prefer_server_cipher_suites: bool = True


@dataclass(frozen=True, slots=True)
class WebConfig:
    """A validated web configuration: TLS (or plain HTTP), basic-auth users, extra response headers."""

    tls: TLSConfig | None = None
    users: tuple[tuple[str, bytes], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()


def _mapping(value: Any, where: str, problems: list[str]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(f"{where}: must be a mapping, got {type(value).__name__}")
        return {}
    return value


def _unknown(doc: Mapping[str, Any], known: tuple[str, ...], where: str, problems: list[str]) -> None:
    for key in doc:
        if key in known:
            continue
        if key in _UNSUPPORTED:
            problems.append(f"{where}{key}: {_UNSUPPORTED[key]} not supported by this exporter")
        else:
            problems.append(f"{where}{key}: unknown key (known: {', '.join(known)})")


def parse_web_config(doc: Any, base_dir: Path) -> WebConfig:
    """Validate a loaded YAML document (pure: no file access); raises WebConfigError listing every problem."""
    cfg, problems = _validate(doc, base_dir)
    if problems:
        raise WebConfigError(problems)
    return cfg


def _validate(doc: Any, base_dir: Path) -> tuple[WebConfig, list[str]]:
    problems: list[str] = []
    top = _mapping(doc, "top level", problems)
    _unknown(top, _TOP_KEYS, "", problems)
    tls = _parse_tls(_mapping(top.get("tls_server_config"), "tls_server_config", problems), base_dir, problems)
    users = _parse_users(_mapping(top.get("basic_auth_users"), "basic_auth_users", problems), problems)
    headers = _parse_http(_mapping(top.get("http_server_config"), "http_server_config", problems), problems)
    return WebConfig(tls=tls, users=users, headers=headers), problems


def _parse_tls(tls: Mapping[str, Any], base_dir: Path, problems: list[str]) -> TLSConfig | None:
    if not tls:
        return None
    _unknown(tls, _TLS_KEYS, "tls_server_config.", problems)

    def path(key: str) -> Path | None:
        value = tls.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, str):
            problems.append(f"tls_server_config.{key}: must be a file name")
            return None
        return base_dir / value  # relative names are relative to the web config file, as in the toolkit

    cert, key, ca = path("cert_file"), path("key_file"), path("client_ca_file")
    if cert is None:
        problems.append("tls_server_config.cert_file: required when tls_server_config is set")
    if key is None:
        problems.append("tls_server_config.key_file: required when tls_server_config is set")
    auth = tls.get("client_auth_type", "NoClientCert")
    if auth in _UNVERIFIED_CLIENT_AUTH:
        problems.append(f"tls_server_config.client_auth_type: {auth} accepts unverified certificates and is "
                        "not supported; use RequireAndVerifyClientCert")
    elif auth not in CLIENT_AUTH:
        problems.append(f"tls_server_config.client_auth_type: {auth!r} is not one of {', '.join(CLIENT_AUTH)}")
    elif auth != "NoClientCert" and ca is None:
        problems.append(f"tls_server_config.client_ca_file: required with client_auth_type {auth}")
    elif auth == "NoClientCert" and ca is not None:
        problems.append("tls_server_config.client_ca_file: set without a client_auth_type that verifies "
                        "(use RequireAndVerifyClientCert)")
    versions = []
    for name, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        value = tls.get(name, default)
        if value not in TLS_VERSIONS:
            problems.append(f"tls_server_config.{name}: {value!r} is not one of {', '.join(TLS_VERSIONS)}")
            value = default
        versions.append(str(value))
    if TLS_VERSIONS[versions[0]] > TLS_VERSIONS[versions[1]]:
        problems.append(f"tls_server_config: min_version {versions[0]} is above max_version {versions[1]}")
    prefer = tls.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        problems.append("tls_server_config.prefer_server_cipher_suites: must be true or false")
        prefer = True
    if cert is None or key is None or not isinstance(auth, str):
        return None
    return TLSConfig(cert_file=cert, key_file=key, client_auth_type=auth, client_ca_file=ca,
                     min_version=versions[0], max_version=versions[1], prefer_server_cipher_suites=prefer)


def _parse_users(users: Mapping[str, Any], problems: list[str]) -> tuple[tuple[str, bytes], ...]:
    out: list[tuple[str, bytes]] = []
    for user, hashed in users.items():
        if not isinstance(user, str) or not user or ":" in user:
            problems.append(f"basic_auth_users: {user!r} is not a valid user name (non-empty, no ':')")
            continue
        m = _BCRYPT_RE.match(hashed) if isinstance(hashed, str) else None
        if m is None:
            problems.append(f"basic_auth_users.{user}: not a bcrypt hash ($2y$10$ + 53 characters); "
                            "generate one with htpasswd -nBC 10 '' | tr -d ':'")
        elif not 4 <= int(m.group(1)) <= 31:
            problems.append(f"basic_auth_users.{user}: bcrypt cost {m.group(1)} is outside 4-31")
        else:
            out.append((user, hashed.encode()))
    return tuple(out)


def _parse_http(http: Mapping[str, Any], problems: list[str]) -> tuple[tuple[str, str], ...]:
    _unknown(http, _HTTP_KEYS, "http_server_config.", problems)
    if not isinstance(http.get("http2", True), bool):
        problems.append("http_server_config.http2: must be true or false")
    out: list[tuple[str, str]] = []
    for name, value in _mapping(http.get("headers"), "http_server_config.headers", problems).items():
        if name not in ALLOWED_HEADERS:
            problems.append(f"http_server_config.headers.{name}: cannot be set (allowed: {', '.join(ALLOWED_HEADERS)})")
        elif not isinstance(value, str) or "\r" in value or "\n" in value:
            problems.append(f"http_server_config.headers.{name}: must be a one-line string")
        else:
            out.append((name, value))
    return tuple(out)


def make_ssl_context(tls: TLSConfig) -> ssl.SSLContext:
    """The server-side SSLContext for `tls` (raises OSError/ssl.SSLError on unreadable or mismatched files)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    ctx.maximum_version = TLS_VERSIONS[tls.max_version]
    ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    ctx.verify_mode = CLIENT_AUTH[tls.client_auth_type]
    if tls.client_ca_file is not None:
        ctx.load_verify_locations(cafile=str(tls.client_ca_file))
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    return ctx


def load_web_config(path: Path) -> WebConfig:
    """Read, validate and trial-load (certificates, keys, CA) a web config file; every problem listed."""
    try:
        doc = yamltext.load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise WebConfigError([f"{path}: {exc}"]) from None
    cfg, problems = _validate(doc, path.parent)
    tls = doc.get("tls_server_config") if isinstance(doc, Mapping) else None
    if isinstance(tls, Mapping):  # missing files are listed alongside the other problems
        for key in ("cert_file", "key_file", "client_ca_file"):
            name = tls.get(key)
            if isinstance(name, str) and name and not (path.parent / name).is_file():
                problems.append(f"tls_server_config.{key}: {path.parent / name} is not a readable file")
    if not problems and cfg.tls is not None:
        try:
            make_ssl_context(cfg.tls)
        except (OSError, ssl.SSLError) as exc:
            problems.append(f"tls_server_config: cannot load certificate/key/CA: {exc}")
    if problems:
        raise WebConfigError(problems)
    return cfg


# --- requests ------------------------------------------------------------------------------------
def accepts_gzip(accept_encoding: str | None) -> bool:
    """True when an Accept-Encoding header value allows gzip (explicitly or via `*`, q > 0)."""
    if not accept_encoding:
        return False
    weights: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, *params = (p.strip() for p in item.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        weights[coding.lower()] = q
    return weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0))) > 0


def gzip_body(body: bytes) -> bytes:
    """`body` gzip-compressed (no timestamp: the same input gives the same bytes)."""
    return gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)


# Probe paths answer without credentials: they reveal only "the process serves" / "first evaluation
# done", and kubelet httpGet probes and compose healthchecks cannot carry a password. TLS still applies.
PROBE_PATHS = frozenset({"/-/healthy", "/-/ready"})


def needs_auth(path: str) -> bool:
    """Whether basic auth guards this request path (query string ignored); the probes are exempt."""
    return path.split("?", 1)[0] not in PROBE_PATHS


class AuthBusy(Exception):
    """bcrypt is busy with other new credentials: answer 429, do not queue (a flood must not take the CPU)."""


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes in constant time.

    bcrypt is slow on purpose (about 60 ms at cost 10), so an unauthenticated client could burn the
    CPU with it. Two bounds: results, good and bad, are cached (a bounded LRU keyed by a SHA-256 of
    user, password and hash), so repeating the same credentials costs one bcrypt; and bcrypt runs
    one check at a time with at most one more waiting: a new credential that finds one waiting
    already, or waits more than `busy_wait_s`, raises AuthBusy.
    """

    def __init__(self, users: tuple[tuple[str, bytes], ...], cache_size: int = 1024,
                 busy_wait_s: float = 1.0) -> None:
        self._users = users
        # A hash to burn the same bcrypt time on for unknown users, so timing does not reveal names.
        self._dummy = users[0][1] if users else b""
        self._cache: OrderedDict[bytes, bool] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._bcrypt = threading.Lock()  # one bcrypt at a time: a flood gets one core at most
        # One check running and one waiting, no more: the HTTP workers are few, a flood must not hold them.
        self._gate = threading.BoundedSemaphore(2)
        self._busy_wait_s = busy_wait_s

    @property
    def enabled(self) -> bool:
        """Whether any user is configured (else every request is allowed)."""
        return bool(self._users)

    def cached(self) -> int:
        """How many credentials' results are cached."""
        with self._lock:
            return len(self._cache)

    def check(self, authorization: str | None) -> bool:
        """True when the header carries a configured user's password (always True with no users);
        raises AuthBusy when new credentials would wait too long for bcrypt."""
        if not self._users:
            return True
        creds = _basic_credentials(authorization)
        if creds is None:
            return False
        user, password = creds
        hashed = self._dummy
        found = False
        for name, candidate in self._users:  # compare every name: no early exit on a match
            if hmac.compare_digest(name.encode(), user.encode()):
                hashed, found = candidate, True
        # bcrypt itself only looks at 72 bytes: the cache key covers the whole password.
        key = hashlib.sha256(b"\0".join((user.encode(), password.encode(), hashed))).digest()
        known = self._cached(key)
        if known is not None:
            return known
        if not self._gate.acquire(blocking=False):
            raise AuthBusy
        try:
            if not self._bcrypt.acquire(timeout=self._busy_wait_s):
                raise AuthBusy
            try:
                known = self._cached(key)  # another thread may have checked the same credentials meanwhile
                if known is not None:
                    return known
                try:
                    ok = bcrypt.checkpw(password.encode(), hashed)
                except ValueError:
                    ok = False
            finally:
                self._bcrypt.release()
        finally:
            self._gate.release()
        ok = ok and found and len(password.encode()) <= 72  # longer passwords would match on a prefix
        with self._lock:
            self._cache[key] = ok
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return ok

    def _cached(self, key: bytes) -> bool | None:
        with self._lock:
            known = self._cache.get(key)
            if known is not None:
                self._cache.move_to_end(key)
            return known


def _basic_credentials(authorization: str | None) -> tuple[str, str] | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(token.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else None


class TLSHTTPServer(BoundedHTTPServer):
    """The bounded HTTP server over TLS: handshakes run in its loop without blocking, bounded by the
    header timeout (a stalled client holds no thread); failed ones (plain HTTP, bad client cert) close."""

    def __init__(self, address: tuple[str, int], handler: Any, context: ssl.SSLContext, **bounds: Any) -> None:
        self.context = context
        super().__init__(address, handler, ssl_context=context, **bounds)
