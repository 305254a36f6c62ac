"""The writer's staging directory (``<state.dir>/staging/<worker.id>``): what icesink deletes
there, and nothing else.

A local Spark writes a round's files, its start-up warm-up and compaction's output into scratch
directories under it (:func:`scratch`), each made fresh by ``mkdtemp`` and deleted by the call
that made it. A crash leaves some behind; :func:`claim`, at the writer's start, deletes those
only where icesink made the directory itself: it then holds a marker file (:data:`MARKER`), and
only its ``icesink-*`` scratch directories are deleted. A directory icesink did not make (named
by settings that point at someone else's files) is used, never emptied.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

MARKER = ".icesink-staging"
#: Every scratch directory's name starts so (tempfile.mkdtemp's prefix).
SCRATCH_PREFIX = "icesink-"
_MARKER_TEXT = ("Made by icesink as a Spark writer's staging directory. At start-up icesink deletes the icesink-* "
                "directories in it (a crash's leftovers), nothing else.\n")


def claim(path: str | Path) -> Path:
    """The staging directory at ``path``, absolute, made with its marker if it is missing;
    the scratch directories a crash left in it deleted if icesink made it."""
    root = Path(os.path.abspath(path))
    marker = root / MARKER
    if not root.exists():
        root.mkdir(parents=True)
        marker.write_text(_MARKER_TEXT)
        return root
    if not root.is_dir():
        raise NotADirectoryError(f"the staging directory {root} is a file")
    if marker.is_file():
        for child in root.iterdir():
            if child.name.startswith(SCRATCH_PREFIX) and child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
        return root
    if not any(root.iterdir()):  # empty: nothing in it can be anyone's
        marker.write_text(_MARKER_TEXT)
        return root
    logger.warning("staging directory %s was not made by icesink (no %s in it): it is used, but nothing in it is "
                   "ever deleted, a crash's leftovers neither", root, MARKER)
    return root


def scratch(base: str | Path | None, prefix: str) -> Path:
    """A fresh, absolute directory under ``base`` (else the system's temporary directory),
    named ``prefix...``; the caller deletes it."""
    assert prefix.startswith(SCRATCH_PREFIX), prefix
    if base is not None:
        Path(base).mkdir(parents=True, exist_ok=True)
    return Path(os.path.abspath(tempfile.mkdtemp(prefix=prefix, dir=base)))
