"""A local host for the Functions app: runs the registered functions without the Functions host.

The Functions host and Core Tools cannot be installed on every machine; this package drives the
same registered functions through the real Durable SDK, with state kept in Azure Storage.
"""
