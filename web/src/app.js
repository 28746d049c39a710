// The page's entry: routes by the URL's fragment (#/, #/jobs/{id}, #/collections/{id}).
import "ol/ol.css";
import "./style.css";
import { showCollection } from "./collection.js";
import { showJob } from "./job.js";
import { showJobs } from "./jobs.js";

const main = document.getElementById("main");
let leave = () => {};

// Only the tile routes' own parameters are passed on to them.
function tileQuery(params) {
  const kept = new URLSearchParams();
  for (const name of ["bands", "rescale"]) if (params.get(name)) kept.set(name, params.get(name));
  return kept.toString() ? `?${kept}` : "";
}

function route() {
  leave();
  // A map page's fragment may carry the tile query: #/jobs/{id}?bands=3,2,1&rescale=0,4000.
  const [hash, query = ""] = (window.location.hash.replace(/^#/, "") || "/").split("?");
  const tiles = tileQuery(new URLSearchParams(query));
  const job = hash.match(/^\/jobs\/([0-9a-f]+)$/);
  const collection = hash.match(/^\/collections\/([a-z0-9][a-z0-9_-]*)$/);
  if (job) leave = showJob(main, job[1], tiles);
  else if (collection) leave = showCollection(main, collection[1], tiles);
  else leave = showJobs(main);
}

window.addEventListener("hashchange", route);
route();
