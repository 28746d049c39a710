"""tilecommit: idempotent raster tiling on Azure Storage.

The library half of the pipeline. Nothing in this package imports ``azure.functions``:
the Functions app (``function_app.py``) and the local host (``devhost``) call into it.
"""

__version__ = "0.1.0"
