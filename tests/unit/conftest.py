"""Hypothesis profiles: ``dev`` (default, keeps the unit suite fast) and ``ci`` (many more
examples): ``pytest --hypothesis-profile=ci tests/unit``. Tests that pin ``max_examples`` in
their own ``@settings`` keep it."""

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile(
    "ci", max_examples=400, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("dev")
