"""The versions pyproject.toml pins, checked at start-up by the packages written against a
library's private parts: agents/kafka/ (faust-streaming, aiokafka) and coordinator/iceberg_ext/
(pyiceberg). Such code is right for the pinned version only; :func:`check_pinned_versions`
refuses any other installed version, naming the library and both versions, instead of letting a
changed internal fail later (or silently do something else).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from icesink.shared.errors import ConfigError

__all__ = ["check_pinned_versions", "pinned_versions"]

_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;,]+)")


def pinned_versions(libraries: Iterable[str], requirements: Iterable[str] | None = None) -> dict[str, str]:
    """The ``==`` pins of ``libraries`` among icesink's requirements (its installed metadata;
    else the pyproject.toml beside the source tree)."""
    reqs = list(requirements) if requirements is not None else _requirements()
    wanted = {_canonical(n): n for n in libraries}
    out: dict[str, str] = {}
    for req in sorted(reqs, key=lambda r: ";" in r):  # a pin of the package itself before an extra's
        m = _PIN.match(req)
        if m and (name := wanted.get(_canonical(m.group(1)))) is not None:
            out.setdefault(name, m.group(2))
    missing = sorted(set(wanted.values()) - set(out))
    if missing:
        raise ConfigError("project.dependencies", reqs, f"a '==' pin of {', '.join(missing)} (pyproject.toml)")
    return out


def check_pinned_versions(libraries: Iterable[str], door: str, installed: dict[str, str] | None = None,
                          pins: dict[str, str] | None = None) -> None:
    """Raise :class:`ConfigError` when an installed version of one of ``libraries`` is not the
    one pyproject.toml pins (``door``: the package written against them, for the message)."""
    libraries = list(libraries)
    pins = pins if pins is not None else pinned_versions(libraries)
    for name in libraries:
        found = installed[name] if installed is not None else _installed(name)
        if found != pins[name]:
            raise ConfigError(
                f"{name} (installed version)", found,
                f"{name}=={pins[name]}, the version pinned in pyproject.toml: {door} uses its private parts and is "
                f"written against that version only. Install {name}=={pins[name]} (pip install -e .), or port "
                f"{door} to {found} and change the pin")


def _installed(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "none installed"


def _requirements() -> list[str]:
    try:
        return list(metadata.requires("icesink") or [])
    except metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        return list(tomllib.loads(pyproject.read_text())["project"]["dependencies"])


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
