"""Who may call the REST API of ``icesink connect``, configured with Kafka Connect's keys.

- ``listeners``: ``http://HOST:PORT`` and ``https://HOST:PORT``, comma-separated (an empty
  host is every interface, as in Kafka Connect). The default binds loopback only.
- https: Kafka Connect's ``listeners.https.ssl.*`` keys, or the same keys without the prefix
  when none has it ("all or nothing", as Kafka's ``valuesWithPrefixAllOrNothing``): keystore
  and truststore as PEM or PKCS12 files (``ssl.keystore.type``, ``ssl.truststore.type``) or
  inline PEM (``ssl.keystore.key``, ``ssl.keystore.certificate.chain``,
  ``ssl.truststore.certificates``), ``ssl.client.auth`` = ``none``, ``requested`` or
  ``required`` (client certificates checked against the truststore), ``ssl.enabled.protocols``.
  What Python's ssl module cannot take is refused at start naming the key (a JKS store, Java's
  algorithm and provider names).
- Basic auth: ``rest.extension.classes`` =
  ``org.apache.kafka.connect.rest.basic.auth.extension.BasicAuthSecurityRestExtension`` with the
  JAAS file Kafka Connect reads from ``-Djava.security.auth.login.config``, here the setting
  ``java.security.auth.login.config``: its ``KafkaConnect`` entry names
  ``PropertyFileLoginModule`` and its ``file``, a properties file of ``user: password`` lines.
  Unlike Kafka's module, an empty credentials file is refused instead of letting everyone in.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import re
import secrets
import ssl
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from icesink.shared.config_providers import parse_properties
from icesink.shared.errors import ConfigError
from icesink.shared.secrets import Hidden

BASIC_AUTH_EXTENSION = "org.apache.kafka.connect.rest.basic.auth.extension.BasicAuthSecurityRestExtension"
LOGIN_MODULE = "org.apache.kafka.connect.rest.basic.auth.extension.PropertyFileLoginModule"
EXTENSIONS = "rest.extension.classes"
JAAS = "java.security.auth.login.config"
HTTPS_PREFIX = "listeners.https."
#: Kafka Connect's REST https keys that Python's ssl can act on.
SSL_KEYS = (
    "ssl.keystore.location", "ssl.keystore.password", "ssl.keystore.type", "ssl.key.password", "ssl.keystore.key",
    "ssl.keystore.certificate.chain", "ssl.truststore.location", "ssl.truststore.password", "ssl.truststore.type",
    "ssl.truststore.certificates", "ssl.client.auth", "ssl.enabled.protocols", "ssl.protocol",
)
#: Kafka Connect's REST https keys naming Java's own machinery: refused.
JAVA_SSL_KEYS = (
    "ssl.cipher.suites", "ssl.provider", "ssl.keymanager.algorithm", "ssl.trustmanager.algorithm",
    "ssl.secure.random.implementation", "ssl.endpoint.identification.algorithm", "ssl.engine.factory.class",
)
SECRET_SSL_KEYS = ("ssl.keystore.password", "ssl.key.password", "ssl.truststore.password", "ssl.keystore.key")
_PROTOCOLS = {"TLSv1.2": ssl.TLSVersion.TLSv1_2, "TLSv1.3": ssl.TLSVersion.TLSv1_3}
_CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def rest_keys(raw: Mapping[str, Any]) -> set[str]:
    """The keys of ``raw`` that configure the REST listeners (consumed by the process)."""
    names = set(SSL_KEYS) | set(JAVA_SSL_KEYS) | {"ssl.client.authentication"}
    return {k for k in raw if k.removeprefix(HTTPS_PREFIX) in names} | ({EXTENSIONS, JAAS} & set(raw))


@dataclass(frozen=True)
class Listener:
    scheme: str
    host: str  # "" = every interface
    port: int

    @property
    def loopback(self) -> bool:
        return self.host in ("localhost", "::1") or self.host.startswith("127.")


def parse_listeners(value: object) -> list[Listener]:
    out = []
    for item in (x.strip() for x in str(value).split(",") if x.strip()):
        try:
            url = urlsplit(item)
            port = url.port
        except ValueError:
            port = None
        if url.scheme.lower() not in ("http", "https") or port is None or url.path not in ("", "/"):
            raise ConfigError("listeners", value, "comma-separated http://HOST:PORT or https://HOST:PORT "
                              "(an empty HOST listens on every interface)")
        out.append(Listener(url.scheme.lower(), url.hostname or "", port))
    if not out:
        raise ConfigError("listeners", value, "at least one http://HOST:PORT or https://HOST:PORT")
    return out


@dataclass(frozen=True)
class RestSecurity:
    """What the API's listeners need: a TLS context for https ones, and the users of basic auth."""

    tls: ssl.SSLContext | None = None
    client_auth: str = "none"
    users: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def authenticated(self) -> bool:
        return bool(self.users) or self.client_auth == "required"

    def secret_values(self) -> set[str]:
        return set(self.users.values())


def rest_security(raw: Mapping[str, Any], listeners: list[Listener]) -> tuple[RestSecurity, set[str]]:
    """The listeners' security from ``raw`` (process settings, references resolved), and its
    secret values (passwords) for log redaction. ConfigError names a bad key."""
    tls_raw, prefix = https_settings(raw)
    secrets_found = {str(tls_raw[k]) for k in SECRET_SSL_KEYS if tls_raw.get(k)}
    for key in ("ssl.client.authentication", f"{HTTPS_PREFIX}ssl.client.authentication"):
        if key in raw:
            raise ConfigError(key, raw[key], f"{key.replace('authentication', 'auth')} (Kafka Connect's name)")
    for key in JAVA_SSL_KEYS:
        if key in tls_raw:
            raise ConfigError(prefix + key, tls_raw[key], "no value: it names Java's TLS machinery, which Python's "
                              "ssl does not have (the defaults of Python's ssl apply)")
    context = None
    client_auth = str(tls_raw.get("ssl.client.auth", "none")).lower()
    if any(x.scheme == "https" for x in listeners):
        context = _server_context(tls_raw, prefix)
    elif tls_raw:
        key = prefix + sorted(tls_raw)[0]
        raise ConfigError(key, _shown(key, tls_raw[sorted(tls_raw)[0]]),
                          "no value without an https:// listener (icesink's Kafka clients take ssl.cafile, "
                          "ssl.certfile and ssl.keyfile)")
    users = _users(raw)
    secrets_found |= set(users.values())
    return RestSecurity(context, client_auth if context is not None else "none", users), secrets_found


def https_settings(raw: Mapping[str, Any]) -> tuple[dict[str, str], str]:
    """The https keys without prefix: ``listeners.https.*`` ones if any, else the plain ones."""
    names = set(SSL_KEYS) | set(JAVA_SSL_KEYS)
    prefixed = {k[len(HTTPS_PREFIX):]: str(v) for k, v in raw.items() if k.startswith(HTTPS_PREFIX)}
    if prefixed:
        for k, v in prefixed.items():
            if k not in names:
                raise ConfigError(HTTPS_PREFIX + k, v, f"one of Kafka Connect's https keys: {', '.join(SSL_KEYS)}")
        return prefixed, HTTPS_PREFIX
    return {k: str(v) for k, v in raw.items() if k in names}, ""


def _shown(key: str, value: object) -> object:
    return Hidden(value) if key.removeprefix(HTTPS_PREFIX) in SECRET_SSL_KEYS else value


def _server_context(tls: Mapping[str, str], prefix: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_keystore(context, tls, prefix)
    if "ssl.enabled.protocols" in tls:
        versions = [p.strip() for p in tls["ssl.enabled.protocols"].split(",") if p.strip()]
        unknown = [v for v in versions if v not in _PROTOCOLS]
        if unknown or not versions:
            raise ConfigError(prefix + "ssl.enabled.protocols", tls["ssl.enabled.protocols"], "TLSv1.2 and/or TLSv1.3")
        context.minimum_version = min(_PROTOCOLS[v] for v in versions)
        context.maximum_version = max(_PROTOCOLS[v] for v in versions)
    if tls.get("ssl.protocol", "TLS") not in ("TLS", "TLSv1.2", "TLSv1.3"):
        raise ConfigError(prefix + "ssl.protocol", tls["ssl.protocol"], "TLS, TLSv1.2 or TLSv1.3 (ssl.enabled.protocols "
                          "decides which versions are accepted)")
    auth = tls.get("ssl.client.auth", "none").lower()
    if auth not in _CLIENT_AUTH:
        raise ConfigError(prefix + "ssl.client.auth", tls["ssl.client.auth"], "none, requested or required")
    trusted = _load_truststore(context, tls, prefix)
    if auth != "none" and not trusted:
        raise ConfigError(prefix + "ssl.truststore.location", None, f"a truststore of the client certificates' "
                          f"authorities, since {prefix}ssl.client.auth is {auth}")
    context.verify_mode = _CLIENT_AUTH[auth]
    return context


def _store_type(tls: Mapping[str, str], prefix: str, store: str, data: bytes | None) -> str:
    key = f"{prefix}ssl.{store}.type"
    declared = tls.get(f"ssl.{store}.type")
    found = None if data is None else "PEM" if b"-----BEGIN" in data[:4096] else \
        "JKS" if data[:4] in (b"\xfe\xed\xfe\xed", b"\xce\xce\xce\xce") else "PKCS12"
    kind = (declared or found or "PEM").upper()
    if kind not in ("PEM", "PKCS12") or found == "JKS":
        raise ConfigError(key, declared or f"(unset; {found} file)", "PEM or PKCS12, what Python can load (convert a JKS "
                          "store: keytool -importkeystore -srcstoretype JKS -deststoretype PKCS12)")
    return kind


def _read(tls: Mapping[str, str], prefix: str, key: str) -> bytes | None:
    path = tls.get(key)
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(prefix + key, path, f"a readable file ({exc.strerror})") from None


def _load_keystore(context: ssl.SSLContext, tls: Mapping[str, str], prefix: str) -> None:
    data = _read(tls, prefix, "ssl.keystore.location")
    inline_key, inline_chain = tls.get("ssl.keystore.key"), tls.get("ssl.keystore.certificate.chain")
    if data is None and not (inline_key and inline_chain):
        raise ConfigError(prefix + "ssl.keystore.location", None, "the server's keystore, since a listener is https "
                          "(or ssl.keystore.key and ssl.keystore.certificate.chain as PEM)")
    kind = _store_type(tls, prefix, "keystore", data)
    if kind == "PKCS12":
        assert data is not None
        key, chain = _pkcs12_key_and_chain(data, tls.get("ssl.keystore.password"), prefix + "ssl.keystore.location")
        content, password = key + chain, None
    else:  # a PEM file holds the private key and the chain; or both inline
        content = data if data is not None else f"{inline_key}\n{inline_chain}\n".encode()
        password = tls.get("ssl.key.password")
    with _private_file(content) as path:
        try:
            context.load_cert_chain(path, password=password)
        except (ssl.SSLError, ValueError) as exc:
            target = "ssl.keystore.location" if data is not None else "ssl.keystore.key"
            raise ConfigError(prefix + target, tls.get(target, "(inline PEM)") if target.endswith("location")
                              else Hidden(""), f"a private key and its certificate chain that load, with "
                              f"{prefix}ssl.key.password if the key is encrypted ({exc})") from None


def _load_truststore(context: ssl.SSLContext, tls: Mapping[str, str], prefix: str) -> bool:
    data = _read(tls, prefix, "ssl.truststore.location")
    inline = tls.get("ssl.truststore.certificates")
    if data is None and not inline:
        return False
    kind = _store_type(tls, prefix, "truststore", data)
    if kind == "PKCS12":
        assert data is not None
        pem = _pkcs12_certificates(data, tls.get("ssl.truststore.password"), prefix + "ssl.truststore.location")
    else:
        pem = data.decode("ascii", errors="replace") if data is not None else str(inline)
    try:
        context.load_verify_locations(cadata=pem)
    except (ssl.SSLError, ValueError) as exc:
        raise ConfigError(prefix + ("ssl.truststore.location" if data is not None else "ssl.truststore.certificates"),
                          tls.get("ssl.truststore.location", "(inline PEM)"), f"certificates that load ({exc})") from None
    return True


def _pkcs12_key_and_chain(data: bytes, password: str | None, key: str) -> tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    try:
        private, cert, extra = pkcs12.load_key_and_certificates(data, password.encode() if password else None)
    except ValueError as exc:
        raise ConfigError(key, "(PKCS12)", f"a PKCS12 keystore that opens with its password ({exc})") from None
    if private is None or cert is None:
        raise ConfigError(key, "(PKCS12)", "a keystore holding the server's private key and certificate")
    key_pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    chain = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in [cert, *extra])
    return key_pem, chain


def _pkcs12_certificates(data: bytes, password: str | None, key: str) -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    try:
        store = pkcs12.load_pkcs12(data, password.encode() if password else None)
    except ValueError as exc:
        raise ConfigError(key, "(PKCS12)", f"a PKCS12 truststore that opens with its password ({exc})") from None
    certs = [c.certificate for c in store.additional_certs] + ([store.cert.certificate] if store.cert else [])
    if not certs:
        raise ConfigError(key, "(PKCS12)", "a truststore holding certificates")
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode() for c in certs)


@contextmanager
def _private_file(content: bytes) -> Iterator[str]:
    """``content`` in a file only this user can read, for ``load_cert_chain`` (which takes
    paths), removed at once. Held in memory when the system has a memory file system."""
    directory = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    fd, path = tempfile.mkstemp(prefix="icesink-tls-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        yield path
    finally:
        os.unlink(path)


def _users(raw: Mapping[str, Any]) -> dict[str, str]:
    extensions = [e.strip() for e in str(raw.get(EXTENSIONS, "")).split(",") if e.strip()]
    unknown = [e for e in extensions if e != BASIC_AUTH_EXTENSION]
    if unknown:
        raise ConfigError(EXTENSIONS, raw[EXTENSIONS], f"{BASIC_AUTH_EXTENSION} (the one REST extension icesink has)")
    if not extensions:
        if raw.get(JAAS):
            raise ConfigError(JAAS, raw[JAAS], f"no value without {EXTENSIONS}={BASIC_AUTH_EXTENSION}, which reads it")
        return {}
    path = raw.get(JAAS)
    if not path:
        raise ConfigError(JAAS, None, f"the JAAS file whose KafkaConnect entry names {LOGIN_MODULE} and its "
                          f"credentials file, since {EXTENSIONS} is the basic auth extension")
    credentials = jaas_credentials_file(str(path))
    try:
        users = parse_properties(Path(credentials).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(JAAS, path, f"a JAAS file whose credentials file {credentials} is readable "
                          f"({exc.strerror})") from None
    if not users:
        raise ConfigError(JAAS, path, f"credentials in {credentials} (user: password lines); an empty file would "
                          "let every request in")
    return users


def jaas_credentials_file(path: str) -> str:
    """The ``file`` option of the ``KafkaConnect`` entry's PropertyFileLoginModule."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(JAAS, path, f"a readable JAAS file ({exc.strerror})") from None
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.DOTALL)
    entry = re.search(r"\bKafkaConnect\s*\{(.*?)\}\s*;", text, flags=re.DOTALL)
    if entry is None:
        raise ConfigError(JAAS, path, "a JAAS file with a KafkaConnect { ... }; entry")
    modules = re.findall(r"([\w.$]+)\s+(required|requisite|sufficient|optional)\b(.*?);", entry.group(1), flags=re.DOTALL)
    if len(modules) != 1 or modules[0][0] != LOGIN_MODULE or modules[0][1] not in ("required", "requisite"):
        raise ConfigError(JAAS, path, f"a KafkaConnect entry of one login module, {LOGIN_MODULE} required")
    options = dict(re.findall(r'([\w.-]+)\s*=\s*"([^"]*)"', modules[0][2]))
    if not options.get("file"):
        raise ConfigError(JAAS, path, f'a file="..." option of {LOGIN_MODULE} (the credentials file)')
    return str(options["file"])


def check_basic(users: Mapping[str, str], header: str | None) -> bool:
    """Whether an ``Authorization`` header carries the password of a known user."""
    if not header or " " not in header:
        return False
    method, _, token = header.partition(" ")
    if method.lower() != "basic":
        return False
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return False
    expected = users.get(user)
    # compared whatever the user, so that the time taken does not tell which users exist
    return bool(sep) and hmac.compare_digest(password.encode(), (expected or secrets.token_hex(8)).encode()) \
        and expected is not None
