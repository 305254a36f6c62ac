"""The library versions agents/kafka/ is written against, checked as a worker starts
(:func:`agents.kafka.install`): faust-streaming and aiokafka as pyproject.toml pins them (mode
comes pinned by faust-streaming). Any other installed version stops the worker at start-up with
a :class:`icesink.shared.errors.ConfigError` naming the library and both versions.
"""

from __future__ import annotations

from icesink.shared.pins import check_pinned_versions

#: The distributions whose internals agents/kafka/ uses.
LIBRARIES = ("faust-streaming", "aiokafka")


def check() -> None:
    """Raise ConfigError unless the installed faust-streaming and aiokafka are the pinned versions."""
    check_pinned_versions(LIBRARIES, "agents/kafka/")
