"""Spark as the Parquet (or ORC or Avro: write.format.default) file writer of icesink; pyiceberg commits the files. Partition
expressions, specs and values are :mod:`icesink.shared.partitioning` (pure, shared with the config).

- :mod:`spark_bridge.schema`: Iceberg schema -> Spark schema with Parquet field ids.
- :mod:`spark_bridge.labels`: partition directory names that map back to one value each.
- :mod:`spark_bridge.session`: :class:`~spark_bridge.session.SparkSettings` and the long-lived session.
- :mod:`spark_bridge.writer`: :class:`~spark_bridge.writer.SparkFileWriter`, Arrow -> DataFiles.
- :mod:`spark_bridge.files`: where files go, Parquet/ORC/Avro options, footers -> DataFiles (no Spark).
- :mod:`spark_bridge.avro`: the Avro schema Iceberg writes, for Spark's Avro writer (no session).
- :mod:`spark_bridge.orc_stats`: an ORC file's column metrics from its footer's statistics (no Spark).
- :mod:`spark_bridge.rewrite`: compaction's rewrite with the writer's session.

Importing this package does not import pyspark; import the submodules you need.
"""
