// The job list: every job of the task hub with its state, progress, elapsed time, cost and error,
// read again every POLL_MS while the page is open (GET /api/jobs).
import { getJson } from "./api.js";
import { el, elapsed, errorText, progressBar, seconds, usd } from "./dom.js";

const POLL_MS = 1500;

function jobRow(job) {
  const name = job.upload?.blob || job.job_id;
  return el(
    "tr",
    { "data-job": job.job_id, "data-state": job.state },
    el("td", {}, el("a", { href: `#/jobs/${job.job_id}` }, job.job_id)),
    el("td", { class: "upload" }, name),
    el("td", {}, el("span", { class: `state ${job.state}` }, job.state)),
    el("td", {}, progressBar(job.progress)),
    el("td", { class: "stage" }, job.progress?.stage || ""),
    el("td", { class: "num" }, seconds(elapsed(job))),
    el("td", { class: "num" }, usd(job.cost)),
    el("td", { class: "error" }, errorText(job.error)),
  );
}

export function showJobs(main) {
  const status = el("p", { class: "status" }, "loading jobs…");
  const body = el("tbody");
  const heads = ["job", "upload", "state", "windows", "stage", "elapsed", "cost", "error"];
  main.replaceChildren(
    el("h1", {}, "Jobs"),
    status,
    el("table", { class: "jobs" }, el("thead", {}, el("tr", {}, heads.map((h) => el("th", {}, h)))), body),
  );
  let timer = null;
  let stopped = false;
  async function poll() {
    try {
      const page = await getJson("jobs?limit=100");
      const jobs = [...page.jobs].sort((a, b) => (b.created || "").localeCompare(a.created || ""));
      body.replaceChildren(...jobs.map(jobRow));
      status.textContent = `${jobs.length} jobs, updated ${new Date().toLocaleTimeString()}`;
    } catch (error) {
      status.textContent = `could not list the jobs: ${error.message}`;
    }
    if (!stopped) timer = setTimeout(poll, POLL_MS);
  }
  poll();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
