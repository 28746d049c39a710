"""Names of the Durable functions, shared by function_app.py, the orchestrators and the tests."""

from tilecommit.settings import TRIGGER_FUNCTION

#: The blob-triggered starter (the Event Grid subscription targets it by this name).
STARTER = TRIGGER_FUNCTION
#: One job: validate -> plan -> batches -> assemble.
TILE_SCENE = "tile_scene"
#: One batch of windows, as a sub-orchestration so no instance's history grows with the scene.
RENDER_BATCH = "render_batch"
#: A group of batches, for large scenes: keeps the job's own history bounded.
RENDER_GROUP = "render_group"

VALIDATE_SOURCE = "validate_source"
RENDER_TILE = "render_tile"
ASSEMBLE_MOSAIC = "assemble_mosaic"
#: A large mosaic's staging in shares: planned once, each share its own activity, then committed
#: by ASSEMBLE_MOSAIC.
PLAN_MOSAIC_SHARES = "plan_mosaic_shares"
STAGE_MOSAIC_SHARE = "stage_mosaic_share"
#: One node of the mosaic's coarse-level reduction tree, before the commit (version 3.0 on).
REDUCE_LEVEL_NODE = "reduce_level_node"
#: The job's item joins its collection (tilecommit/catalog/collections.py), after the assembly.
ADD_TO_COLLECTION = "add_to_collection"
#: The job's STAC item into the catalog (pgstac), once its mosaic is assembled; before its event.
PUBLISH_ITEM = "publish_item"
#: The job's completion event (completed or failed), once it ended.
PUBLISH_JOB_EVENT = "publish_job_event"

#: A scrub of one finished job: verify every window against its source, repair on request.
VERIFY_SCENE = "verify_scene"
VERIFY_GROUP = "verify_group"
VERIFY_BATCH = "verify_batch"
VERIFY_WINDOW = "verify_window"
VERIFY_OUTPUTS = "verify_outputs"
REBUILD_MOSAIC = "rebuild_mosaic"
#: The HTTP route that starts a scrub: POST /api/jobs/{job_id}/verify[?repair=true].
VERIFY_ROUTE = "verify_job"
#: A scrub's state and report: GET /api/jobs/{job_id}/verify/{verify_id}.
VERIFY_STATUS_ROUTE = "get_verify"
#: The job API: GET /api/jobs/{job_id}, GET /api/jobs, POST /api/jobs/{job_id}/cancel and /retry.
JOB_ROUTE = "get_job"
JOBS_ROUTE = "list_jobs"
CANCEL_ROUTE = "cancel_job"
RETRY_ROUTE = "retry_job"
#: What the web page reads: GET /api/jobs/{job_id}/windows (the timeline),
#: /api/jobs/{job_id}/outputs/{name} (item.json, quicklook.png), /api/collections/{collection_id}.
WINDOWS_ROUTE = "job_windows"
OUTPUT_ROUTE = "job_output"
COLLECTION_ROUTE = "get_collection"
#: The web page's files: GET /api/ui/{*path}.
WEB_PAGE_ROUTE = "web_page"
#: Map tiles (docs/tiles.md): GET /api/tiles/jobs/{job_id}/tilejson.json and .../{z}/{x}/{y}.png,
#: GET /api/tiles/collections/{collection_id}/tilejson.json and .../{z}/{x}/{y}.png.
JOB_TILEJSON_ROUTE = "job_tilejson"
JOB_TILE_ROUTE = "job_tile"
COLLECTION_TILEJSON_ROUTE = "collection_tilejson"
COLLECTION_TILE_ROUTE = "collection_tile"
#: The daily timer that purges what finished jobs no longer need (tiles, rows, history).
RETENTION_SWEEP = "retention_sweep"

#: A backfill: the blobs already stored under a prefix, each started as its upload would be.
BACKFILL = "backfill"
LIST_BACKFILL_PAGE = "list_backfill_page"
SURVEY_BACKFILL_BLOBS = "survey_backfill_blobs"
START_BACKFILL_JOBS = "start_backfill_jobs"
COUNT_RUNNING_JOBS = "count_running_jobs"
#: POST /api/backfill, GET /api/backfill/{backfill_id}, POST /api/backfill/{backfill_id}/cancel.
BACKFILL_ROUTE = "start_backfill"
BACKFILL_STATUS_ROUTE = "get_backfill"
BACKFILL_CANCEL_ROUTE = "cancel_backfill"
