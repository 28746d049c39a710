// A map of one mosaic: the app's XYZ tiles (from its TileJSON) in WebMercatorQuad, with a
// footprint drawn over them. No basemap: the page never loads anything from a third party.
import OlMap from "ol/Map.js";
import View from "ol/View.js";
import GeoJSON from "ol/format/GeoJSON.js";
import TileLayer from "ol/layer/Tile.js";
import VectorLayer from "ol/layer/Vector.js";
import { transformExtent } from "ol/proj.js";
import VectorSource from "ol/source/Vector.js";
import XYZ from "ol/source/XYZ.js";
import { Stroke, Style } from "ol/style.js";
import { authHeaders } from "./api.js";
import { el } from "./dom.js";

// A tile fetched with the page's key header (an <img> cannot send one), handed to the map as an
// object URL; a tile the route refuses (outside the mosaic) is left empty.
function loadTile(tile, src) {
  const image = tile.getImage();
  fetch(src, { headers: authHeaders() })
    .then((response) => (response.ok ? response.blob() : Promise.reject(new Error(String(response.status)))))
    .then((blob) => {
      const url = URL.createObjectURL(blob);
      image.addEventListener("load", () => URL.revokeObjectURL(url), { once: true });
      image.src = url;
    })
    .catch(() => tile.setState(3)); // TileState.ERROR
}

function footprintLayer(geometry) {
  const source = new VectorSource();
  if (geometry) {
    const feature = new GeoJSON().readFeature(
      { type: "Feature", geometry, properties: {} },
      { dataProjection: "EPSG:4326", featureProjection: "EPSG:3857" },
    );
    source.addFeature(feature);
  }
  const style = new Style({ stroke: new Stroke({ color: "#d62728", width: 2 }) });
  return new VectorLayer({ source, style });
}

// The map in `target`, from `tilejson` (the tile route's TileJSON) and an optional GeoJSON
// `geometry` (WGS84) as the footprint. Exposed as window.tilecommitMap for the browser tests.
export function mosaicMap(target, tilejson, geometry) {
  // Only tiles over the mosaic's bounds are asked for: the route refuses the others (404).
  const extent = Array.isArray(tilejson.bounds) ? transformExtent(tilejson.bounds, "EPSG:4326", "EPSG:3857") : undefined;
  const tiles = new TileLayer({
    extent,
    source: new XYZ({
      url: tilejson.tiles[0],
      minZoom: tilejson.minzoom ?? 0,
      maxZoom: tilejson.maxzoom ?? 22,
      tileSize: tilejson.tileSize ?? 256,
      tileLoadFunction: loadTile,
      crossOrigin: "anonymous",
      transition: 0,
    }),
  });
  const map = new OlMap({
    target,
    layers: [tiles, footprintLayer(geometry)],
    view: new View({ center: [0, 0], zoom: 2, maxZoom: (tilejson.maxzoom ?? 22) + 2 }),
  });
  // The map measures its box asynchronously (a ResizeObserver); fitting needs its size now.
  map.updateSize();
  if (extent) map.getView().fit(extent, { padding: [20, 20, 20, 20] });
  window.tilecommitMap = map;
  return map;
}

export function mapBox() {
  return el("div", { class: "map", id: "map" });
}
