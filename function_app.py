"""The Functions app: the only module that knows bindings.

A blob upload (Event Grid source) starts one Durable job per upload version; the job fans out
one activity per window through batch sub-orchestrations and fans in to the mosaic assembly.
"""

import gc
import json
import os
from urllib.parse import urlsplit

# PROJ fetches a grid file over the network when a CRS names one and PROJ_NETWORK is on; a CRS
# comes from an upload, which is untrusted, so this worker process never lets it (PROJ reads the
# variable when GDAL first uses it, after this line). docs/uploads.md lists every such setting.
os.environ["PROJ_NETWORK"] = "OFF"

import azure.durable_functions as df  # noqa: E402 - after the process settings above
import azure.functions as func
import azurefunctions.extensions.bindings.blob as blob

from activities import catalog as catalog_activities
from activities import tiling as activities
from activities import verify as verify_activities
from client_functions import (
    backfill,
    backfill_pages,
    job_api,
    job_views,
    retention,
    starter,
    tiles,
    verify_start,
    web_page,
)
from client_functions.context import client_context, tile_maker
from orchestrators import backfill as backfill_orchestrator
from orchestrators import names
from orchestrators import tiling as orchestrators
from orchestrators import verify as verify_orchestrators
from tilecommit.errors import JobApiError, JobNotVerifiable
from tilecommit.observability import monitoring, telemetry
from tilecommit.observability.observed import observed_activity, observed_job
from tilecommit.settings import SETTING_INPUT_CONTAINER, STORAGE_CONNECTION

# Application Insights (with the app's identity) when it is configured, OTEL_*_EXPORTER locally,
# else nothing: see tilecommit/observability/monitoring.py for what the host exports and what this process does.
monitoring.configure_telemetry()


def tiling_functions(activity_functions=activities, catalog_functions=catalog_activities) -> df.Blueprint:
    """The orchestrators and the activities they call, bound under the names the orchestrators use.

    ``activity_functions`` supplies ``validate_source``, ``render_tile``, ``assemble_mosaic``,
    ``plan_mosaic_shares``, ``stage_mosaic_share``, ``reduce_level_node`` and ``publish_job_event``, ``catalog_functions``
    ``add_to_collection`` and ``publish_item``: the real ones for this app; bench/null_app.py passes stand-ins that do no raster work, so
    the benchmark runs the same orchestrators with the same bindings. A fresh blueprint on each
    call: the SDK wraps each function as it registers it, and an app indexes its functions once.
    Each activity execution and each job's end is recorded (:mod:`tilecommit.observability.observed`).
    """
    bp = df.Blueprint()
    _orchestrator(bp, names.TILE_SCENE, observed_job(orchestrators.tile_scene))
    _orchestrator(bp, names.RENDER_GROUP, orchestrators.render_group)
    _orchestrator(bp, names.RENDER_BATCH, orchestrators.render_batch)
    _activity(bp, names.VALIDATE_SOURCE, activity_functions.validate_source, input_name="job")
    _activity(bp, names.RENDER_TILE, activity_functions.render_tile, on_result=telemetry.count_tile)
    _activity(bp, names.ASSEMBLE_MOSAIC, activity_functions.assemble_mosaic)
    _activity(bp, names.PLAN_MOSAIC_SHARES, activity_functions.plan_mosaic_shares)
    _activity(bp, names.STAGE_MOSAIC_SHARE, activity_functions.stage_mosaic_share)
    _activity(bp, names.REDUCE_LEVEL_NODE, activity_functions.reduce_level_node)
    _activity(bp, names.ADD_TO_COLLECTION, catalog_functions.add_to_collection)
    _activity(bp, names.PUBLISH_ITEM, catalog_functions.publish_item)
    _activity(bp, names.PUBLISH_JOB_EVENT, activity_functions.publish_job_event)
    return bp


def verify_functions() -> df.Blueprint:
    """The scrub: verify_scene and its batches, verifying (and repairing) one window per activity."""
    bp = df.Blueprint()
    _orchestrator(bp, names.VERIFY_SCENE, verify_orchestrators.verify_scene)
    _orchestrator(bp, names.VERIFY_GROUP, verify_orchestrators.verify_group)
    _orchestrator(bp, names.VERIFY_BATCH, verify_orchestrators.verify_batch)
    _activity(bp, names.VERIFY_WINDOW, verify_activities.verify_window)
    _activity(bp, names.VERIFY_OUTPUTS, verify_activities.verify_outputs)
    _activity(bp, names.REBUILD_MOSAIC, verify_activities.rebuild_mosaic)
    return bp


def backfill_functions() -> df.Blueprint:
    """The backfill: its orchestration and its activities, three of which take a Durable client
    (client_functions/backfill_pages.py says why an activity, and why it may)."""
    bp = df.Blueprint()
    _orchestrator(bp, names.BACKFILL, backfill_orchestrator.backfill)
    # An activity is called by its function's name (the extension's), so each is named for it.
    bp.function_name(names.LIST_BACKFILL_PAGE)(
        bp.activity_trigger(input_name="payload", activity=names.LIST_BACKFILL_PAGE)(backfill_pages.list_page)
    )
    for name, function in (
        (names.SURVEY_BACKFILL_BLOBS, backfill_pages.survey_blobs),
        (names.START_BACKFILL_JOBS, backfill_pages.start_blobs),
        (names.COUNT_RUNNING_JOBS, backfill_pages.count_running),
    ):
        with_client = bp.durable_client_input(client_name="client")(function)
        bp.function_name(name)(bp.activity_trigger(input_name="payload", activity=name)(with_client))
    return bp


def _orchestrator(bp: df.Blueprint, name: str, function) -> None:
    bp.orchestration_trigger(context_name="context", orchestration=name)(function)


def _activity(bp: df.Blueprint, name: str, function, *, input_name: str = "payload", on_result=None) -> None:
    """Bind ``function`` as the activity ``name``, held to the activities' contract as a whole
    (:func:`activities.tiling.held_to_contract`), each execution recorded (:func:`observed_activity`)."""
    held = activities.held_to_contract(name, function)
    bp.activity_trigger(input_name=input_name, activity=name)(observed_activity(name, held, on_result))


app = df.DFApp(http_auth_level=func.AuthLevel.FUNCTION)
app.register_functions(tiling_functions())
app.register_functions(verify_functions())
app.register_functions(backfill_functions())


def json_response(body: object, status_code: int = 200) -> func.HttpResponse:
    return func.HttpResponse(json.dumps(body), status_code=status_code, mimetype="application/json")


async def answer(call, status_code: int = 200) -> func.HttpResponse:
    """The job API's answer to one request: ``await call`` as JSON, or its refusal as JSON."""
    try:
        return json_response(await call, status_code)
    except JobApiError as exc:
        return json_response(exc.body(), exc.status)


@app.function_name(names.JOB_ROUTE)
@app.route(route="jobs/{job_id}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
@app.durable_client_input(client_name="client")
async def get_job(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    """GET /api/jobs/{job_id}: the job's state, progress, upload, profile, outputs and error."""
    return await answer(job_api.get_job(client, req.route_params["job_id"]))


@app.function_name(names.JOBS_ROUTE)
@app.route(route="jobs", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
@app.durable_client_input(client_name="client")
async def list_jobs(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    """GET /api/jobs[?state=failed,running][&since=ISO 8601][&limit=N][&cursor=C]: a page of jobs."""
    try:
        limit = int(req.params.get("limit") or job_api.DEFAULT_LIMIT)
    except ValueError:
        return json_response(JobApiError(400, "invalid-limit", "limit must be a whole number").body(), 400)
    page = job_api.list_jobs(
        client,
        state=req.params.get("state"),
        since=req.params.get("since"),
        limit=limit,
        cursor=req.params.get("cursor"),
    )
    return await answer(page)


@app.function_name(names.CANCEL_ROUTE)
@app.route(route="jobs/{job_id}/cancel", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
@app.durable_client_input(client_name="client")
async def cancel_job(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    """POST /api/jobs/{job_id}/cancel[?reason=...]: stop a running job; 202. Its tiles stay valid."""
    reason = req.params.get("reason") or "cancelled through the job API"
    return await answer(job_api.cancel_job(client, client_context().manifest, req.route_params["job_id"], reason), 202)


@app.function_name(names.RETRY_ROUTE)
@app.route(route="jobs/{job_id}/retry", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
@app.durable_client_input(client_name="client")
async def retry_job(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    """POST /api/jobs/{job_id}/retry: run a failed or cancelled job again (only its missing windows); 202."""
    return await answer(job_api.retry_job(client, client_context().manifest, req.route_params["job_id"]), 202)


@app.function_name(names.VERIFY_ROUTE)
@app.route(route="jobs/{job_id}/verify", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
@app.durable_client_input(client_name="client")
async def verify_job(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    """POST /api/jobs/{job_id}/verify[?repair=true]: start a scrub of a finished job (completed or
    failed); 202 with its id and its status URL on this API. Never the Durable extension's
    management URLs: in Azure they carry the extension's system key (``code=``)."""
    job_id = req.route_params["job_id"]
    repair = req.params.get("repair", "").lower() in ("true", "1", "yes")
    try:
        instance_id = await verify_start.start_verify(client, job_id, repair=repair)
    except JobNotVerifiable as exc:
        return json_response(JobApiError(404, "job-not-verifiable", str(exc)).body(), 404)
    url = urlsplit(req.url)  # its query may hold the caller's own key: left out
    status_url = f"{url.scheme}://{url.netloc}{url.path.rstrip('/')}/{instance_id}"
    return json_response({"id": instance_id, "job_id": job_id, "repair": repair, "status_url": status_url}, 202)


@app.function_name(names.VERIFY_STATUS_ROUTE)
@app.route(route="jobs/{job_id}/verify/{verify_id}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
@app.durable_client_input(client_name="client")
async def get_verify(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    """GET /api/jobs/{job_id}/verify/{verify_id}: a scrub's state, and its report once it has ended."""
    return await answer(verify_start.verify_view(client, req.route_params["job_id"], req.route_params["verify_id"]))


async def blob_answer(call) -> func.HttpResponse:
    """A stored output as it is, with its strong ETag and caching, or the job API's refusal."""
    try:
        found = await call
    except JobApiError as exc:
        return json_response(exc.body(), exc.status)
    headers = {"ETag": found.etag, "Cache-Control": found.cache_control, "X-Content-Type-Options": "nosniff"}
    return func.HttpResponse(found.body, status_code=200, mimetype=found.content_type, headers=headers)


@app.function_name(names.WINDOWS_ROUTE)
@app.route(route="jobs/{job_id}/windows", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
@app.durable_client_input(client_name="client")
async def job_windows(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    """GET /api/jobs/{job_id}/windows: per window, when it was scheduled, started and finished."""
    return await answer(job_views.window_timeline(client, client_context().manifest, req.route_params["job_id"]))


@app.function_name(names.OUTPUT_ROUTE)
@app.route(route="jobs/{job_id}/outputs/{name}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
@app.durable_client_input(client_name="client")
async def job_output(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    """GET /api/jobs/{job_id}/outputs/{item.json|quicklook.png}: a completed job's item or quicklook."""
    job_id, name = req.route_params["job_id"], req.route_params["name"]
    return await blob_answer(job_views.job_output(client, client_context().output, job_id, name))


@app.function_name(names.COLLECTION_ROUTE)
@app.route(route="collections/{collection_id}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
async def get_collection(req: func.HttpRequest) -> func.HttpResponse:
    """GET /api/collections/{collection_id}: the collection's STAC Collection document."""
    return await blob_answer(job_views.collection_document(client_context().output, req.route_params["collection_id"]))


@app.function_name(names.WEB_PAGE_ROUTE)
# Anonymous: the page's files are the same for everyone and hold no data; every request the page
# then makes for data goes to a route that needs the function key (docs/dashboard.md).
@app.route(route="ui/{*path}", methods=["GET"], auth_level=func.AuthLevel.ANONYMOUS)
def web_page_file(req: func.HttpRequest) -> func.HttpResponse:
    """GET /api/ui/{path}: the web page (index.html at /api/ui/), its script and style."""
    path = req.route_params.get("path") or ""
    if not path and not urlsplit(req.url).path.endswith("/"):
        # The page names its files relative to itself: it must be loaded from the folder's URL.
        return func.HttpResponse(status_code=308, headers={"Location": f"{urlsplit(req.url).path}/"})
    found = web_page.serve(path, req.headers.get("if-none-match"))
    mimetype = found.headers.get("Content-Type", "text/plain").split(";")[0]  # the same type, for any worker
    return func.HttpResponse(found.body, status_code=found.status, headers=found.headers, mimetype=mimetype)


def tile_response(answer: tiles.Answer) -> func.HttpResponse:
    return func.HttpResponse(answer.body, status_code=answer.status, mimetype=answer.mimetype, headers=answer.headers)


def _zxy(req: func.HttpRequest) -> tuple[str, str, str]:
    return req.route_params["z"], req.route_params["x"], req.route_params["y"]


@app.function_name(names.JOB_TILEJSON_ROUTE)
@app.route(route="tiles/jobs/{job_id}/tilejson.json", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
@app.durable_client_input(client_name="client")
async def job_tilejson(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    """GET /api/tiles/jobs/{job_id}/tilejson.json[?bands=..][&rescale=..]: the TileJSON of the job's mosaic."""
    return tile_response(
        await tiles.job_tilejson(client, tile_maker(), req.route_params["job_id"], req.url, req.params)
    )


@app.function_name(names.JOB_TILE_ROUTE)
@app.route(route="tiles/jobs/{job_id}/{z}/{x}/{y}.png", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
@app.durable_client_input(client_name="client")
async def job_tile(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    """GET /api/tiles/jobs/{job_id}/{z}/{x}/{y}.png[?bands=1,2,3][&rescale=min,max]: a PNG tile of the job's mosaic."""
    answer = await tiles.job_tile(
        client, tile_maker(), req.route_params["job_id"], _zxy(req), req.params, req.headers.get("If-None-Match")
    )
    return tile_response(answer)


@app.function_name(names.COLLECTION_TILEJSON_ROUTE)
@app.route(route="tiles/collections/{collection_id}/tilejson.json", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
async def collection_tilejson(req: func.HttpRequest) -> func.HttpResponse:
    """GET /api/tiles/collections/{collection_id}/tilejson.json: the TileJSON of the collection's mosaics."""
    return tile_response(
        await tiles.collection_tilejson(tile_maker(), req.route_params["collection_id"], req.url, req.params)
    )


@app.function_name(names.COLLECTION_TILE_ROUTE)
@app.route(
    route="tiles/collections/{collection_id}/{z}/{x}/{y}.png", methods=["GET"], auth_level=func.AuthLevel.FUNCTION
)
async def collection_tile(req: func.HttpRequest) -> func.HttpResponse:
    """GET /api/tiles/collections/{collection_id}/{z}/{x}/{y}.png: a PNG tile of the collection's mosaics."""
    answer = await tiles.collection_tile(
        tile_maker(), req.route_params["collection_id"], _zxy(req), req.params, req.headers.get("If-None-Match")
    )
    return tile_response(answer)


@app.function_name(names.BACKFILL_ROUTE)
@app.route(route="backfill", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
@app.durable_client_input(client_name="client")
async def start_backfill(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    """POST /api/backfill {"container", "prefix", "dry_run", "max_running"}: start the backfill of
    those arguments (202), or report it (running, completed: 200), or resume it (failed,
    cancelled: 202)."""
    try:
        values = req.get_json() if req.get_body() else {}
    except ValueError:
        return json_response(JobApiError(400, "invalid-backfill", "the body is not JSON").body(), 400)
    if not isinstance(values, dict):
        return json_response(JobApiError(400, "invalid-backfill", "the body is not a JSON object").body(), 400)
    ctx = client_context()
    try:
        request = backfill.request_from(values, ctx.settings.input_container)
        view = await backfill.start_backfill(client, request, ctx.uploads)
    except JobApiError as exc:
        return json_response(exc.body(), exc.status)
    return json_response(view, 202 if view["action"] in ("started", "resumed") else 200)


@app.function_name(names.BACKFILL_STATUS_ROUTE)
@app.route(route="backfill/{backfill_id}", methods=["GET"], auth_level=func.AuthLevel.FUNCTION)
@app.durable_client_input(client_name="client")
async def get_backfill(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    """GET /api/backfill/{backfill_id}: a backfill's state, stage, counts and running jobs."""
    return await answer(backfill.get_backfill(client, req.route_params["backfill_id"]))


@app.function_name(names.BACKFILL_CANCEL_ROUTE)
@app.route(route="backfill/{backfill_id}/cancel", methods=["POST"], auth_level=func.AuthLevel.FUNCTION)
@app.durable_client_input(client_name="client")
async def cancel_backfill(req: func.HttpRequest, client: df.DurableOrchestrationClient) -> func.HttpResponse:
    """POST /api/backfill/{backfill_id}/cancel: stop a backfill; 202. The jobs it started run on."""
    reason = req.params.get("reason") or "cancelled through the backfill API"
    return await answer(backfill.cancel_backfill(client, req.route_params["backfill_id"], reason), 202)


@app.function_name(names.RETENTION_SWEEP)
# Daily at 03:30 UTC (NCRONTAB: second minute hour day month weekday). The platform wakes a
# scaled-to-zero app for its timers; a run missed anyway runs late, as past due (the schedule
# monitor keeps each run's time in the host's storage). A run that stops half-way is finished
# by the next: the sweep is safe to repeat.
@app.timer_trigger(arg_name="timer", schedule="0 30 3 * * *")
@app.durable_client_input(client_name="client")
async def retention_sweep(timer: func.TimerRequest, client: df.DurableOrchestrationClient) -> None:
    """Purge the tiles, manifest rows and history of jobs finished more than the retention ago."""
    ctx = client_context()
    await retention.sweep_as_configured(
        client, ctx.manifest, ctx.tiles, retention_days=ctx.settings.tile_retention_days
    )


@app.function_name(names.STARTER)
@app.blob_trigger(
    arg_name="upload",
    # %...% is resolved from app settings by the host, so the container is configuration.
    path=f"%{SETTING_INPUT_CONTAINER}%/{{name}}",
    connection=STORAGE_CONNECTION,
    source=func.BlobSource.EVENT_GRID,
)
@app.durable_client_input(client_name="client")
async def raster_uploaded(upload: blob.BlobClient, client: df.DurableOrchestrationClient) -> None:
    # The SDK-type binding hands over a client, not the blob's bytes: a raster can be GBs. What
    # raising here does (the event is delivered again): client_functions/starter.py, _restart_failed.
    ctx = client_context()
    await starter.start_job(upload, client, ctx.settings, ctx.manifest, ctx.uploads)


# Everything made so far lives as long as this worker process: the imported modules (the Azure
# SDKs, rasterio, the Durable SDK) and the functions just registered, about 130,000 objects the
# cyclic garbage collector tracks. Each of its full collections would walk them all again (about
# 80 ms a walk here; 3 or 4 in a 10240² job, more the longer a worker lives). gc.freeze() moves
# them to a generation no collection looks at (Python's gc module docs); objects made later are
# collected as before. A 10240² job through the local host: full collections 0.07-0.09 CPU-s
# instead of 0.13-0.25, the process about 0.2 of 20 CPU-s less (docs/benchmarks.md).
gc.freeze()
