"""Secret masking. Leaf module: imports nothing with I/O.

Which settings are secret (README, "Secrets"): ``sasl.password`` and ``ssl.password``
(``SecretStr``); in the catalog properties (``iceberg.catalog.*``) and the Spark conf
(``spark.*``) every key named ``header.*`` or containing ``key``, ``token``, ``secret``,
``password`` or ``credential``; the password of any URL with one (``scheme://user:PASSWORD@host``,
the catalog ``uri``); a ``token=`` parameter of a Spark Connect URL.

Two layers: :func:`mask_setting` masks values where settings are shown (start-up log,
config errors), and :class:`Redactor` removes every secret value from free text (log
records, ``/status`` and ``/metrics`` bodies), for errors that quote a setting.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from urllib.parse import unquote

MASK = "**********"

_SECRET_WORDS = ("key", "token", "secret", "password", "credential")
# scheme://user:password@host: the password ends at the last '@' before the host part.
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*:)(?P<pw>[^/?#\s]*)(?=@)")
# Spark Connect: sc://host:port/;token=...;user_id=...
_URL_TOKEN = re.compile(r"(?P<head>[;?&]token=)(?P<pw>[^;&\s]*)", re.IGNORECASE)
#: Secret values shorter than this (or numbers, booleans) are masked where settings are shown,
#: but not searched for in free text (a one-letter password would blank every log line).
MIN_REDACT_LEN = 3


def is_secret_key(key: str) -> bool:
    """Whether a catalog property or Spark conf key names a secret (by its name)."""
    k = key.lower()
    return k.startswith(("header.", "spark.header.")) or any(w in k for w in _SECRET_WORDS)


def url_secrets(value: str) -> list[str]:
    """Passwords and tokens inside URLs in ``value`` (as written and percent-decoded)."""
    found = [m["pw"] for m in _URL_PASSWORD.finditer(value)] + [m["pw"] for m in _URL_TOKEN.finditer(value)]
    return [s for pw in found if pw for s in {pw, unquote(pw)}]


def mask_url(value: str) -> str:
    """``value`` with the password of any URL in it, and any ``token=`` parameter, masked."""
    value = _URL_PASSWORD.sub(lambda m: m["head"] + MASK, value)
    return _URL_TOKEN.sub(lambda m: m["head"] + MASK, value)


def mask_setting(key: str, value: object) -> object:
    """How to show one catalog property or Spark conf value."""
    if is_secret_key(key):
        return MASK
    return mask_url(value) if isinstance(value, str) else value


class Hidden:
    """Stands for a secret value in an error message: shows its type, never the value."""

    def __init__(self, value: object) -> None:
        self.type_name = type(value).__name__

    def __repr__(self) -> str:
        return f"<secret of type {self.type_name}, not shown>"


def _searchable(value: str) -> bool:
    """Whether a secret value is searched for in free text: not too short, and not a number or
    boolean (``spark.io.encryption.keySizeBits=256`` names a setting, not a secret; blanking
    every "256" would garble the logs)."""
    return len(value) >= MIN_REDACT_LEN and not _NOT_SECRET.match(value)


_NOT_SECRET = re.compile(r"^(\d+|true|false)$", re.IGNORECASE)


#: Secrets the process learned after its settings were read (the group's control secret from the
#: catalog, icesink/shared/group_secret.py): every :class:`Redactor` masks them too. A tuple, replaced
#: whole, so the threads that redact (the HTTP server's) never see it change under them.
_learned: tuple[str, ...] = ()
_learning = threading.Lock()


def learn_secret(value: str) -> None:
    """From now on, mask ``value`` wherever any :class:`Redactor` of this process masks."""
    global _learned
    with _learning:
        if value not in _learned:
            _learned = (*_learned, value)


class Redactor:
    """Replaces every known secret value in a text by :data:`MASK` (longest first): the given
    ones and those the process learned (:func:`learn_secret`)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._own = frozenset(s for s in secrets if _searchable(s))
        self._compile(_learned)

    def _compile(self, learned: tuple[str, ...]) -> None:
        values = sorted(self._own.union(s for s in learned if _searchable(s)), key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(s) for s in values)) if values else None
        self._learned = learned

    def __call__(self, text: str) -> str:
        learned = _learned
        if learned is not self._learned:
            self._compile(learned)
        text = mask_url(text)
        pattern = self._pattern
        return text if pattern is None else pattern.sub(MASK, text)

    def __bool__(self) -> bool:
        if _learned is not self._learned:
            self._compile(_learned)
        return self._pattern is not None


class RedactingFilter(logging.Filter):
    """A handler filter that rewrites each record's message, exception and stack text through a
    :class:`Redactor` before any handler formats it."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__()
        self.redact = redact
        self._formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # bad arguments: logging would report it in emit; never raise here
            message = f"{record.msg} (log arguments that do not fit: {record.args!r})"
        record.msg = self.redact(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


def install_log_redaction(redact: Redactor, logger: logging.Logger | None = None) -> None:
    """Add a :class:`RedactingFilter` to every handler of ``logger`` (default: the root logger,
    which every icesink, Faust, aiokafka and pyiceberg record reaches)."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter(redact))
