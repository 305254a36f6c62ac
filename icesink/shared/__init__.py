"""The ground floor: what the worker (agents/), the commit protocol (coordinator/) and the file
writer (spark_bridge/) share, below all three. The leaf modules (the control protocol, settings,
errors, metrics, partition expressions, writable types, ...) import no I/O package; the glue
(the control topic's producer and reader, the catalog, the admin client, offload, signing, the
group's secret) does I/O but imports nothing above this package. The composition root,
:mod:`icesink.app`, stands above everything and is the one package that imports it all.
"""
