"""The local catalog of ``devhost serve --catalog`` and ``make demo``: a PostgreSQL with PostGIS and
pgstac of its own (testkit/postgres.py), the app's settings pointed at it, and the STAC API over it
(stac-fastapi-pgstac, testkit/stac_api.py), all on 127.0.0.1 and all stopped on exit.

Without ``start_database``, a pgstac the settings already name (``TILECOMMIT_PGSTAC_HOST``, with
``trust`` authentication: a local one) gets the STAC API alone; a catalog that signs in with
Microsoft Entra is Azure's, served by its own deployment, and none is started for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from testkit.postgres import LocalPostgres
from testkit.stac_api import StacApi
from tilecommit.settings import PGSTAC_AUTH_TRUST, SETTING_STAC_API_URL, Settings


@contextmanager
def local_catalog(start_database: bool) -> Iterator[StacApi | None]:
    """The STAC API over the local catalog (None when there is none to serve)."""
    with ExitStack() as stack:
        if start_database:
            database = stack.enter_context(LocalPostgres())
            os.environ.update(database.settings())
        settings = Settings.from_env()
        if not settings.publishes or settings.pgstac_auth != PGSTAC_AUTH_TRUST:
            yield None
            return
        api = stack.enter_context(
            StacApi(
                db_host=settings.pgstac_host,
                db_port=settings.pgstac_port,
                database=settings.pgstac_database,
                user=settings.pgstac_user,
            )
        )
        os.environ.setdefault(SETTING_STAC_API_URL, api.url)
        yield api
