"""Signed control events (``iceberg.control.secret``).

With a secret set, every control event a replica sends carries an HMAC-SHA256 of its key and
value under that secret, in the record header ``icesink-signature``, and every reader skips an
event whose signature is missing or wrong (logged with its control offset and counted, like
any invalid event). Events written by anyone outside the group, who lacks the secret, are then
ignored however well-formed they are: a forged ``StartCommit`` with a huge epoch, a response
impersonating an owner. Every replica of a group must have the same secret. Leaf module: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

HEADER = "icesink-signature"


def sign(secret: bytes, key: bytes | None, value: bytes | None) -> bytes:
    mac = hmac.new(secret, digestmod=hashlib.sha256)
    key = key or b""
    mac.update(len(key).to_bytes(4, "big"))
    mac.update(key)
    mac.update(value or b"")
    return mac.digest()


def problem(secret: bytes, key: bytes | None, value: bytes | None,
            headers: Iterable[tuple[str, bytes]] | None) -> str | None:
    """None if the record is signed with ``secret``, else what is wrong with its signature."""
    found = [v for name, v in (headers or ()) if name == HEADER]
    if not found:
        return "no signature"
    if len(found) > 1 or not isinstance(found[0], bytes) or not hmac.compare_digest(found[0], sign(secret, key, value)):
        return "a wrong signature"
    return None
