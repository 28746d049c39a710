"""The STAC API's entry point in Azure Container Apps (infra/modules/stac-api.bicep runs it with
``python -c`` in the pinned stac-fastapi-pgstac image): stac-fastapi-pgstac's read-only API whose
database pool signs in to pgstac with Microsoft Entra tokens of the container's managed identity.

stac-fastapi-pgstac's own pool puts one password in its connection string at start; an Entra
token expires (a managed identity's within a day), and a pool opens connections for as long as the
container runs. So the pool is made here with asyncpg's password callable, which asyncpg calls for
every new connection: a token from the Container Apps identity endpoint, fetched again five
minutes before it expires. Only the standard library and what the image holds are imported.
The Transactions extension stays off (stac-fastapi-pgstac's default): the role is pgstac_read.
"""

import json
import os
import time
import urllib.parse
import urllib.request
from contextlib import asynccontextmanager

import asyncpg
import uvicorn
from stac_fastapi.pgstac import db
from stac_fastapi.pgstac.app import instantiate_api

#: The resource of Azure Database for PostgreSQL's Entra tokens.
RESOURCE = "https://ossrdbms-aad.database.windows.net"
#: Seconds before a token's expiry it is replaced.
EARLY = 300
_token = {"value": "", "expires_on": 0.0}


def entra_token() -> str:
    """The identity's token for the database, from the Container Apps identity endpoint
    (IDENTITY_ENDPOINT, IDENTITY_HEADER), reused until :data:`EARLY` seconds before it expires."""
    if time.time() < _token["expires_on"] - EARLY:
        return str(_token["value"])
    query = urllib.parse.urlencode(
        {"resource": RESOURCE, "api-version": "2019-08-01", "client_id": os.environ["AZURE_CLIENT_ID"]}
    )
    request = urllib.request.Request(
        f"{os.environ['IDENTITY_ENDPOINT']}?{query}", headers={"X-IDENTITY-HEADER": os.environ["IDENTITY_HEADER"]}
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        body = json.load(response)
    _token.update(value=body["access_token"], expires_on=float(body["expires_on"]))
    return str(_token["value"])


@asynccontextmanager
async def lifespan(app):
    app.state.readpool = await asyncpg.create_pool(
        host=os.environ["PGHOST"],
        port=int(os.environ.get("PGPORT", "5432")),
        database=os.environ["PGDATABASE"],
        user=os.environ["PGUSER"],
        # asyncpg calls a callable password for every new connection; a plain function rather than
        # a coroutine (which only its newer releases await), blocking the loop for the identity
        # endpoint's answer once a day at most.
        password=entra_token,
        ssl="require",
        min_size=1,
        max_size=int(os.environ.get("DB_MAX_CONN_SIZE", "10")),
        max_inactive_connection_lifetime=300,
        init=db.con_init,
        server_settings={"search_path": "pgstac,public", "application_name": "tilecommit-stac-api"},
    )
    app.state.get_connection = db.get_connection
    yield
    await db.close_db_connection(app)


if __name__ == "__main__":
    # Inside the container: Container Apps' ingress forwards to this port from outside it.
    uvicorn.run(instantiate_api(lifespan=lifespan).app, host="0.0.0.0", port=8080, proxy_headers=True)  # noqa: S104
