// One collection: its document's facts and its mosaic on a map (the collection tile route).
import { getJson } from "./api.js";
import { el } from "./dom.js";
import { mapBox, mosaicMap } from "./map.js";

function bboxPolygon(bbox) {
  if (!Array.isArray(bbox)) return null;
  const [w, s, e, n] = bbox;
  return { type: "Polygon", coordinates: [[[w, s], [e, s], [e, n], [w, n], [w, s]]] };
}

export function showCollection(main, collectionId, tiles = "") {
  main.replaceChildren(el("h1", {}, `Collection ${collectionId}`), el("p", { class: "status" }, "loading…"));
  (async () => {
    try {
      const [doc, tilejson] = await Promise.all([
        getJson(`collections/${collectionId}`),
        getJson(`tiles/collections/${collectionId}/tilejson.json${tiles}`),
      ]);
      const map = mapBox();
      const facts = [
        ["title", doc.title || doc.id],
        ["items", doc["tilecommit:items"] ?? ""],
        ["revision", doc["tilecommit:revision"] ?? ""],
        ["bbox", JSON.stringify(doc["tilecommit:bbox"])],
        ["interval", JSON.stringify(doc.extent?.temporal?.interval?.[0] || null)],
      ];
      main.replaceChildren(
        el("h1", {}, `Collection ${collectionId}`),
        el("table", { class: "facts" }, facts.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, String(v))))),
        map,
      );
      mosaicMap(map, tilejson, bboxPolygon(doc["tilecommit:bbox"]));
    } catch (error) {
      main.lastChild.textContent = `could not read the collection: ${error.message}`;
    }
  })();
  return () => {};
}
