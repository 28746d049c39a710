"""A local host for the Functions app: runs the registered functions without the Functions host.

The Functions host and Core Tools cannot be installed on every machine; this package drives the
same registered functions through the real Durable SDK, with state kept in Azure Storage.

- :mod:`devhost.durable`: the imitation of the Functions host and the Durable extension;
- the modules here: the developer's tools around it, ``python -m devhost`` (the CLI, one upload
  through a running host, the embedded Azurite, the demo, ``serve --hosts N``, ``verify``,
  ``replay-dead-letters``).
"""
