// One job: its state and progress (read again while it runs), its actions, the mosaic on a map
// with its footprint, the quicklook, the STAC item and the timeline of its windows.
import { API, authHeaders, getJson, request } from "./api.js";
import { el, elapsed, errorText, progressBar, seconds, usd } from "./dom.js";
import { mapBox, mosaicMap } from "./map.js";
import { timeline } from "./timeline.js";

const POLL_MS = 1500;
const TIMELINE_EVERY = 4;
const ACTIONS = [
  { name: "cancel", when: ["pending", "running"], ask: "Cancel this job? Its finished tiles stay; a retry resumes it." },
  { name: "retry", when: ["failed", "terminated"], ask: "Run this job again? Only its missing windows are rendered." },
  { name: "verify", when: ["completed", "failed"], ask: "Verify this job's tiles and mosaic against its upload?" },
];

function summaryTable(job) {
  const rows = [
    ["state", el("span", { class: `state ${job.state}`, id: "job-state" }, job.state)],
    ["stage", job.progress?.stage || ""],
    ["windows", progressBar(job.progress)],
    ["elapsed", seconds(elapsed(job))],
    ["cost", usd(job.cost)],
    ["upload", job.upload?.blob || ""],
    ["profile", typeof job.profile === "string" ? job.profile : JSON.stringify(job.profile ?? "")],
    ["error", errorText(job.error)],
  ];
  if (job.summary?.collection?.collection) {
    const id = job.summary.collection.collection;
    rows.push(["collection", el("a", { href: `#/collections/${id}` }, id)]);
  }
  return el("table", { class: "facts" }, rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))));
}

function actionButtons(job, say) {
  return ACTIONS.filter((a) => a.when.includes(job.state)).map((action) =>
    el(
      "button",
      {
        type: "button",
        "data-action": action.name,
        onclick: async () => {
          if (!window.confirm(action.ask)) return;
          const response = await request(`jobs/${job.job_id}/${action.name}`, { method: "POST" });
          const body = await response.json().catch(() => null);
          say(response.ok ? `${action.name}: accepted (${response.status})` : `${action.name}: ${body?.error?.message || response.status}`);
          if (response.ok && action.name === "verify") followScrub(job.job_id, body.id, say);
        },
      },
      action.name,
    ),
  );
}

// A scrub started from the page: its state until it ends, then what it found.
async function followScrub(jobId, scrubId, say) {
  try {
    const scrub = await getJson(`jobs/${jobId}/verify/${scrubId}`);
    if (scrub.state === "completed") {
      const r = scrub.report;
      say(`verify: ${r.windows} windows checked, ${r.windows_differing} differing, outputs differing: ${JSON.stringify(r.outputs_differing)}`);
    } else if (scrub.error) say(`verify: ${scrub.state}: ${JSON.stringify(scrub.error)}`);
    else {
      say(`verify: ${scrub.state}…`);
      setTimeout(() => followScrub(jobId, scrubId, say), POLL_MS);
    }
  } catch (error) {
    say(`verify: ${error.message}`);
  }
}

async function showOutputs(job, box, tiles) {
  const itemPath = `jobs/${job.job_id}/outputs/item.json`;
  const map = mapBox();
  const item = await getJson(itemPath).catch((error) => ({ error: error.message }));
  box.replaceChildren(
    el("h2", {}, "Mosaic"),
    map,
    el("div", { class: "side" }, el("h2", {}, "Quicklook"), await quicklookImage(job), el("h2", {}, "STAC item"),
      el("p", {}, el("a", { href: API + itemPath, target: "_blank", id: "stac-link" }, "item.json")),
      el("pre", { class: "stac", id: "stac-item" }, JSON.stringify(item, null, 2))),
  );
  try {
    mosaicMap(map, await getJson(`tiles/jobs/${job.job_id}/tilejson.json${tiles}`), item.geometry);
  } catch (error) {
    map.replaceChildren(el("p", { class: "status" }, `no map: ${error.message}`));
  }
}

async function quicklookImage(job) {
  const response = await fetch(`${API}jobs/${job.job_id}/outputs/quicklook.png`, { headers: authHeaders() });
  if (!response.ok) return el("p", {}, `no quicklook (${response.status})`);
  return el("img", { class: "quicklook", id: "quicklook", alt: "quicklook", src: URL.createObjectURL(await response.blob()) });
}

export function showJob(main, jobId, tiles = "") {
  const head = el("div");
  const note = el("p", { class: "status", id: "action-note" });
  const outputs = el("section", { class: "outputs" });
  const windows = el("section", {}, el("h2", {}, "Windows"), el("div", { id: "timeline" }));
  main.replaceChildren(el("h1", {}, `Job ${jobId}`), note, head, outputs, windows);
  const say = (text) => { note.textContent = text; };
  let timer = null;
  let stopped = false;
  let shownOutputs = false;
  let polls = 0;
  let lastState = null;
  async function poll() {
    let job = null;
    try {
      job = await getJson(`jobs/${jobId}`);
      head.replaceChildren(summaryTable(job), el("div", { class: "actions" }, actionButtons(job, say)));
      // The timeline reads every batch's input and every manifest row: less often than the state.
      if (polls++ % TIMELINE_EVERY === 0 || job.state !== lastState) {
        const rows = await getJson(`jobs/${jobId}/windows`);
        windows.lastChild.replaceChildren(timeline(rows.windows));
      }
      lastState = job.state;
      if (job.state === "completed" && !shownOutputs) {
        shownOutputs = true;
        await showOutputs(job, outputs, tiles);
      }
    } catch (error) {
      say(`could not read the job: ${error.message}`);
    }
    const settled = job && job.state === "completed" && shownOutputs;
    if (!stopped) timer = setTimeout(poll, settled ? POLL_MS * 4 : POLL_MS);
  }
  poll();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
