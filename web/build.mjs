// Builds the web page into web/dist: the bundle of web/src/app.js (OpenLayers included, from
// node_modules) and its CSS, named by their content's hash so they can be cached for good, and
// index.html naming them. Run by `make setup` (the Makefile's web/dist/index.html target).
import { build } from "esbuild";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const dist = path.join(here, "dist");
await rm(dist, { recursive: true, force: true });
await mkdir(dist, { recursive: true });

const result = await build({
  entryPoints: [path.join(here, "src", "app.js")],
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  sourcemap: false,
  entryNames: "[name]-[hash]",
  outdir: dist,
  metafile: true,
  logLevel: "warning",
});

const outputs = Object.keys(result.metafile.outputs).map((file) => path.basename(file));
const script = outputs.find((name) => name.endsWith(".js"));
const style = outputs.find((name) => name.endsWith(".css"));
if (!script || !style) throw new Error(`the build made ${outputs.join(", ")}: expected one .js and one .css`);
const page = await readFile(path.join(here, "src", "index.html"), "utf8");
await writeFile(path.join(dist, "index.html"), page.replace("{{script}}", script).replace("{{style}}", style));
console.log(`web/dist: index.html, ${script}, ${style}`);
