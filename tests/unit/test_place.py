"""``spark_bridge.files.place``: a staged write's files to the table's directory.

A round of many tables stages one directory per table and moved each file out of it into a
directory made anew, then deleted the emptied one: a directory made and one removed per table
per round. On ext4 without a journal (this project's machines) every later file creation then
skips each recently removed inode, reading it, for a minute or more: the commits that follow
paid up to 0.9 ms a file (bench/README.md, "Files made and removed"). A staged directory on the
same file system now becomes the table's directory by one rename."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from icesink.shared.errors import SparkWriteError
from spark_bridge.files import place


def staged(root: Path, *relatives: str) -> Path:
    """A stage directory holding a small Parquet file at each relative path, and Hadoop's .crc beside one."""
    for relative in relatives:
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"x": [1, 2]}), path)
    first = root / relatives[0]
    (first.parent / f".{first.name}.crc").write_bytes(b"crc")
    return root


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_staged_directory_becomes_the_tables_by_one_rename(tmp_path) -> None:
    stage = staged(tmp_path / "stage" / "out" / "icesink_table=0", "part-0.parquet", "day=1/part-1.parquet")
    inode = stage.stat().st_ino
    out = tmp_path / "wh" / "db" / "t" / "data" / "prefix"
    (tmp_path / "wh" / "db" / "t").mkdir(parents=True)

    place(pafs.LocalFileSystem(), str(stage), pafs.LocalFileSystem(), str(out), out.as_uri(), 2, move=True)

    assert files_under(out) == ["day=1/part-1.parquet", "part-0.parquet"]  # no .crc
    assert out.stat().st_ino == inode  # the stage's own directory: none made, none removed
    assert not stage.exists()
    assert pq.read_table(out / "day=1" / "part-1.parquet").num_rows == 2


def test_an_existing_table_directory_gets_the_files_moved_into_it(tmp_path) -> None:
    stage = staged(tmp_path / "stage", "part-0.parquet")
    out = tmp_path / "data" / "prefix"
    out.mkdir(parents=True)
    (out / "other.parquet").write_bytes(b"someone else's")

    place(pafs.LocalFileSystem(), str(stage), pafs.LocalFileSystem(), str(out), out.as_uri(), 1, move=True)

    assert files_under(out) == ["other.parquet", "part-0.parquet"]
    assert (out / "other.parquet").read_bytes() == b"someone else's"


def test_copied_when_not_moved(tmp_path) -> None:
    stage = staged(tmp_path / "stage", "part-0.parquet")
    out = tmp_path / "data" / "prefix"

    place(pafs.LocalFileSystem(), str(stage), pafs.LocalFileSystem(), str(out), out.as_uri(), 1)

    assert files_under(out) == ["part-0.parquet"]
    assert (stage / "part-0.parquet").exists()


def test_an_unexpected_file_in_the_stage_places_nothing(tmp_path) -> None:
    stage = staged(tmp_path / "stage", "part-0.parquet")
    (stage / "_SUCCESS").write_bytes(b"")
    out = tmp_path / "data" / "prefix"

    with pytest.raises(SparkWriteError, match="_SUCCESS"):
        place(pafs.LocalFileSystem(), str(stage), pafs.LocalFileSystem(), str(out), out.as_uri(), 1, move=True)

    assert not out.exists()
    assert (stage / "part-0.parquet").exists()


def test_across_file_systems_the_files_are_moved_one_by_one(tmp_path, monkeypatch) -> None:
    stage = staged(tmp_path / "stage", "part-0.parquet", "day=1/part-1.parquet")
    out = tmp_path / "data" / "prefix"
    real_rename = os.rename

    def cross_device(src: str, dst: str) -> None:
        if Path(src) == stage:
            raise OSError(18, "Invalid cross-device link")
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", cross_device)
    place(pafs.LocalFileSystem(), str(stage), pafs.LocalFileSystem(), str(out), out.as_uri(), 2, move=True)

    assert files_under(out) == ["day=1/part-1.parquet", "part-0.parquet"]
