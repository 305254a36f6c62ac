"""Spark as the Parquet file writer of icesink; pyiceberg commits the files. Partition
expressions, specs and values are :mod:`icesink.partitioning` (pure, shared with the config).

- :mod:`spark_bridge.schema`: Iceberg schema -> Spark schema with Parquet field ids.
- :mod:`spark_bridge.labels`: partition directory names that map back to one value each.
- :mod:`spark_bridge.writer`: :class:`~spark_bridge.writer.SparkFileWriter`, Arrow -> DataFiles.

Importing this package does not import pyspark; import the submodules you need.
"""
