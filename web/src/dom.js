// A few helpers to build the page's elements without an HTML template engine.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    // Through the CSSOM: the page's Content-Security-Policy refuses style attributes.
    else if (name === "style") Object.assign(node.style, value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

export function seconds(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "";
  if (value < 60) return `${value.toFixed(1)} s`;
  const minutes = Math.floor(value / 60);
  return minutes < 60 ? `${minutes} min ${Math.round(value % 60)} s` : `${Math.floor(minutes / 60)} h ${minutes % 60} min`;
}

export function elapsed(job, now = Date.now()) {
  if (!job.created) return null;
  const running = job.state === "running" || job.state === "pending";
  const end = running ? now : Date.parse(job.updated || job.created);
  return Math.max(0, (end - Date.parse(job.created)) / 1000);
}

export function usd(cost) {
  return cost && typeof cost.usd === "number" ? `$${cost.usd.toFixed(6)}` : "";
}

export function progressBar(progress) {
  const done = progress?.windows_done ?? 0;
  const total = progress?.windows_total;
  const bar = el("progress", { max: total || 1, value: total ? done : 0 });
  return el("span", { class: "progress" }, bar, el("span", { class: "count" }, total ? `${done} / ${total}` : "-"));
}

export function errorText(error) {
  if (!error) return "";
  return typeof error.message === "string" ? error.message : JSON.stringify(error.message);
}
