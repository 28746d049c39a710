// The page's entry: routes by the URL's fragment (#/, #/jobs/{id}, #/collections/{id}).
import "ol/ol.css";
import "./style.css";
import { showCollection } from "./collection.js";
import { showJob } from "./job.js";
import { showJobs } from "./jobs.js";

const main = document.getElementById("main");
let leave = () => {};

function route() {
  leave();
  const hash = window.location.hash.replace(/^#/, "") || "/";
  const job = hash.match(/^\/jobs\/([0-9a-f]+)$/);
  const collection = hash.match(/^\/collections\/([a-z0-9][a-z0-9_-]*)$/);
  if (job) leave = showJob(main, job[1]);
  else if (collection) leave = showCollection(main, collection[1]);
  else leave = showJobs(main);
}

window.addEventListener("hashchange", route);
route();
