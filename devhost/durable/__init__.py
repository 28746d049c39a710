"""The imitation: the Functions host, the Durable extension with its Azure Storage provider, and
the Azure services around them that the app meets (Event Grid delivering uploads to the blob
trigger and taking the completion events, the plan's instance memory limit).

Each module plays one part of the real thing and says which (docs/local-host.md has the sources,
row by row). Nothing here knows the developer tools of :mod:`devhost` (the CLI, the embedded
Azurite, the demo): they use this package, never the other way round.
"""
