package io.icesink.hadoop;

import org.apache.hadoop.fs.LocalFileSystem;

/**
 * Hadoop's local file system over {@link NioRawLocalFileSystem}, writing no checksum files.
 * Hadoop's own writes a {@code .name.crc} beside every file it creates: a second file to create,
 * checksum, rename at the job's commit and delete again (spark_bridge/writer.py removes them),
 * for each of the hundreds of small files of a round routed to many tables. Iceberg's data files
 * carry no Hadoop checksums anywhere else either (object stores have none). Reads still check a
 * checksum file that is there.
 */
public class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new NioRawLocalFileSystem());
    setWriteChecksum(false);
  }
}
