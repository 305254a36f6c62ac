"""Signed control events.

Every control event a replica sends carries an HMAC-SHA256 of its key and value under the
group's secret, in the record header ``icesink-signature``, and every reader skips an event
whose signature is missing or wrong (logged with its control offset and counted, like any
invalid event). Events written by anyone outside the group, who lacks the secret, are then
ignored however well-formed they are: a forged ``StartCommit`` with a huge epoch, an empty
``DataComplete`` impersonating an owner. The secret is ``iceberg.control.secret`` if set, else
the group's own, kept in the catalog (icesink/shared/group_secret.py). Leaf module: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Iterable

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


class Keyring:
    """The group's signing key, shared by a replica's control producer and readers, loaded once
    before they send or read (agents/worker.py), replaced if the stored secret turns out to be
    another (a provisioning race, icesink/shared/group_secret.py).

    ``unsigned_below``: the control offset where the group's signing began on this log. An
    event below it without a signature was written by the group before it signed (an upgrade);
    nobody can write below it any more, so it is accepted. ``on_refused`` is called for each
    event of the group refused for its signature (the replica may read the secret again)."""

    def __init__(self, key: bytes | None = None, unsigned_below: int = 0,
                 on_refused: Callable[[], None] | None = None) -> None:
        self.key = key
        self.unsigned_below = unsigned_below
        self.on_refused = on_refused

    def load(self, key: bytes, unsigned_below: int = 0) -> None:
        self.key, self.unsigned_below = key, unsigned_below

    @property
    def loaded(self) -> bool:
        return self.key is not None

    def sign(self, key: bytes | None, value: bytes | None) -> bytes:
        if self.key is None:
            raise RuntimeError("control signing key not loaded yet")
        return sign(self.key, key, value)

    def problem(self, offset: int, key: bytes | None, value: bytes | None,
                headers: Iterable[tuple[str, bytes]] | None) -> str | None:
        """None if the record at ``offset`` is to be trusted, else what is wrong with it."""
        if self.key is None:
            return "no key to check it with (the group's secret is not loaded)"
        headers = list(headers or ())
        if offset < self.unsigned_below and not any(name == HEADER for name, _ in headers):
            return None
        wrong = problem(self.key, key, value, headers)
        if wrong is not None and self.on_refused is not None:
            self.on_refused()
        return wrong
