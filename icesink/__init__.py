"""icesink: stream Kafka topics into Apache Iceberg tables exactly once."""
