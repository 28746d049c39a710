// The job's windows on one time axis, as Durable Functions Monitor draws an orchestration's
// activities: per window a grey bar from when its batch scheduled it to when it started (the
// queue wait) and a blue bar from then to when its tile's manifest row was written (the run).
import { el, seconds } from "./dom.js";

export function timeline(rows) {
  const times = rows.flatMap((r) => [r.scheduled, r.started, r.finished]).filter(Boolean).map(Date.parse);
  if (!times.length) return el("p", { class: "status" }, "no window has started yet");
  const start = Math.min(...times);
  const span = Math.max(1, Math.max(...times) - start);
  const at = (iso) => ((Date.parse(iso) - start) / span) * 100;
  const table = el("div", { class: "timeline" });
  for (const row of rows) {
    const bars = el("div", { class: "bars" });
    if (row.scheduled && row.started) {
      const left = at(row.scheduled);
      bars.append(el("span", { class: "wait", style: { left: `${left}%`, width: `${Math.max(0.3, at(row.started) - left)}%` } }));
    }
    if (row.started && row.finished) {
      const left = at(row.started);
      bars.append(el("span", { class: "run", style: { left: `${left}%`, width: `${Math.max(0.3, at(row.finished) - left)}%` } }));
    }
    const title = `wait ${seconds(row.queue_s) || "?"}, run ${seconds(row.run_s) || "?"}`;
    table.append(
      el(
        "div",
        { class: "lane", title, "data-window": row.window },
        el("span", { class: "label" }, row.window),
        bars,
        el("span", { class: "num" }, title),
      ),
    );
  }
  return el("div", {}, el("p", { class: "legend" }, el("span", { class: "wait" }), " queue wait ", el("span", { class: "run" }), " run"), table);
}
