// Every request the page makes to the app goes through here. Locally (devhost serve without a
// key) nothing is needed. In Azure the job API and the tile routes need a function key: the user
// types it once into the header's form, it is kept in this tab's sessionStorage (never in a URL,
// so never in a log or a Referer) and sent as the x-functions-key header. A map tile is fetched
// the same way (map.js), since an <img> cannot carry a header.
const KEY_STORE = "tilecommit.function-key";
export const API = new URL("../", document.baseURI).pathname; // the page is served at /api/ui/

export class ApiError extends Error {
  constructor(status, body) {
    super(body?.error?.message || body?.message || `the app answered ${status}`);
    this.status = status;
    this.body = body;
  }
}

export function authHeaders() {
  const key = sessionStorage.getItem(KEY_STORE);
  return key ? { "x-functions-key": key } : {};
}

function askForKey() {
  const form = document.getElementById("key-form");
  form.hidden = false;
  form.onsubmit = (event) => {
    event.preventDefault();
    sessionStorage.setItem(KEY_STORE, document.getElementById("key-input").value);
    form.hidden = true;
    window.dispatchEvent(new HashChangeEvent("hashchange"));
  };
}

export async function request(path, { method = "GET" } = {}) {
  const response = await fetch(API + path, { method, headers: authHeaders() });
  if (response.status === 401) askForKey();
  return response;
}

export async function getJson(path, options) {
  const response = await request(path, options);
  const text = await response.text();
  const body = text ? JSON.parse(text) : null;
  if (!response.ok) throw new ApiError(response.status, body);
  return body;
}
