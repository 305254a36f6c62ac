"""The composition root: the one package that imports everything and wires it together.

- :mod:`icesink.app.cli`: the ``icesink`` command; a replica is a worker (agents/) that runs
  the coordinator (coordinator/) while it leads the group;
- :mod:`icesink.app.replicas`: worker replicas as child processes (the demo, the tests);
- :mod:`icesink.app.stack`, :mod:`icesink.app.embedded`: the embedded broker and catalog of a
  worker started with nothing external configured;
- :mod:`icesink.app.demo`, :mod:`icesink.app.pizzas`: the pizza demo and its events;
- :mod:`icesink.app.connect`, :mod:`icesink.app.connect_state`, :mod:`icesink.app.connect_api`:
  ``icesink connect`` and its Kafka Connect REST API;
- :mod:`icesink.app.status`: the /metrics and /status HTTP server of a process.

Nothing outside this package imports it (tests/unit/test_layout.py).
"""
