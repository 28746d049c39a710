"""The tile routes' work: a request's path and query checked, the tile or TileJSON made by the
library (:mod:`tilecommit.tiles`), every refusal a JSON error body with its 4xx status.

function_app.py's routes call these with the request's parts and send the :class:`Answer` back;
the job's state is asked of the Durable client only when a job has no committed mosaic, to tell
an unknown job (404) from one not finished (409).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlencode, urlsplit

import azure.durable_functions as df

from tilecommit.catalog.naming import check_collection_id
from tilecommit.errors import BadInputError, InvalidNameError, JobApiError, StorageFaultError, TileCommitError
from tilecommit.jobs import check_job_id
from tilecommit.tiles.query import TileQuery, parse_query, parse_tile

from . import job_api

if TYPE_CHECKING:  # rio-tiler is imported with the first tile's maker (client_functions/context.py)
    from tilecommit.tiles.render import Tile, TileMaker

#: A tile is a function of the mosaic's version (in its ETag) and its URL's parameters, and a
#: committed mosaic is never changed in place: caches may keep it a year without asking again.
TILE_CACHE_CONTROL = "public, max-age=31536000, immutable"
#: A TileJSON names the mosaic's current bounds and zooms; a collection's grow as jobs finish.
TILEJSON_CACHE_CONTROL = "public, max-age=60"
#: Seconds a client is told to wait after a storage fault (503).
RETRY_AFTER_S = 5


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    mimetype: str
    headers: dict[str, str] = field(default_factory=dict)


def error_answer(exc: JobApiError) -> Answer:
    return Answer(exc.status, json.dumps(exc.body()).encode(), "application/json")


def _tile_answer(tile: Tile) -> Answer:
    headers = {"ETag": tile.etag, "Cache-Control": TILE_CACHE_CONTROL}
    if tile.png is None:
        return Answer(304, b"", "image/png", headers)
    return Answer(200, tile.png, "image/png", headers)


async def _answered(call) -> Answer:
    """``await call``; a refusal as its JSON error, a storage fault as 503 (retry later), a mosaic
    the library could not read as 502: never a stack trace."""
    try:
        return await call
    except JobApiError as exc:
        return error_answer(exc)
    except InvalidNameError as exc:
        return error_answer(JobApiError(400, "invalid-job-id", str(exc)))
    except StorageFaultError as exc:
        answer = error_answer(JobApiError(503, "storage-unavailable", f"reading the mosaic failed: {exc}"))
        return Answer(answer.status, answer.body, answer.mimetype, {"Retry-After": str(RETRY_AFTER_S)})
    except TileCommitError as exc:
        return error_answer(JobApiError(502, "mosaic-unreadable", f"{type(exc).__name__}: {exc}"))


async def _no_mosaic(client: df.DurableOrchestrationClient, job_id: str) -> JobApiError:
    """Why job ``job_id`` has no committed mosaic: no such job (404, raised), not finished (409),
    or finished without one (404)."""
    status = await job_api.job_status(client, job_id)
    state = status.runtime_status.value.lower()
    if status.runtime_status in job_api.FINISHED:
        return JobApiError(404, "no-mosaic", f"job {job_id} is {state} and has no committed mosaic")
    return JobApiError(409, "job-not-finished", f"job {job_id} is {state}: its mosaic is not committed yet")


def _collection(collection_id: str) -> str:
    try:
        return check_collection_id(collection_id, where="the URL")
    except BadInputError as exc:
        raise JobApiError(400, "invalid-collection-id", str(exc)) from None


def tiles_url(request_url: str, query: TileQuery) -> str:
    """The tile URL template beside a TileJSON's own URL, with the query's parameters (never the
    caller's ``code``: a function key is no part of a map's URL)."""
    url = urlsplit(request_url)
    base = url.path.rsplit("/", 1)[0]
    params = urlencode(query.params(), safe=",")
    return f"{url.scheme}://{url.netloc}{base}/{{z}}/{{x}}/{{y}}.png" + (f"?{params}" if params else "")


async def job_tile(
    client: df.DurableOrchestrationClient,
    maker: TileMaker,
    job_id: str,
    zxy: tuple[str, str, str],
    params: Mapping[str, str],
    if_none_match: str | None,
) -> Answer:
    async def call() -> Answer:
        check_job_id(job_id)
        z, x, y = parse_tile(*zxy)
        query = parse_query(params)
        tile = await asyncio.to_thread(maker.job_tile, job_id, z, x, y, query, if_none_match)
        if tile is None:
            raise await _no_mosaic(client, job_id)
        return _tile_answer(tile)

    return await _answered(call())


async def job_tilejson(
    client: df.DurableOrchestrationClient, maker: TileMaker, job_id: str, request_url: str, params: Mapping[str, str]
) -> Answer:
    async def call() -> Answer:
        check_job_id(job_id)
        query = parse_query(params)
        doc = await asyncio.to_thread(maker.job_tilejson, job_id, tiles_url(request_url, query))
        if doc is None:
            raise await _no_mosaic(client, job_id)
        return Answer(200, json.dumps(doc).encode(), "application/json", {"Cache-Control": TILEJSON_CACHE_CONTROL})

    return await _answered(call())


async def collection_tile(
    maker: TileMaker,
    collection_id: str,
    zxy: tuple[str, str, str],
    params: Mapping[str, str],
    if_none_match: str | None,
) -> Answer:
    async def call() -> Answer:
        collection = _collection(collection_id)
        z, x, y = parse_tile(*zxy)
        query = parse_query(params)
        tile = await asyncio.to_thread(maker.collection_tile, collection, z, x, y, query, if_none_match)
        if tile is None:
            raise JobApiError(404, "collection-not-found", f"no collection {collection}")
        return _tile_answer(tile)

    return await _answered(call())


async def collection_tilejson(
    maker: TileMaker, collection_id: str, request_url: str, params: Mapping[str, str]
) -> Answer:
    async def call() -> Answer:
        collection = _collection(collection_id)
        query = parse_query(params)
        doc = await asyncio.to_thread(maker.collection_tilejson, collection, tiles_url(request_url, query))
        if doc is None:
            raise JobApiError(404, "collection-not-found", f"no collection {collection}")
        return Answer(200, json.dumps(doc).encode(), "application/json", {"Cache-Control": TILEJSON_CACHE_CONTROL})

    return await _answered(call())
