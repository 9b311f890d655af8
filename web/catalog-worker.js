// The catalog off the page's thread (docs/viewer.md, "A catalog of thousands"):
// this worker fetches /api/browse/sessions and /api/browse/acquisitions,
// revalidates both with their etag (If-None-Match: an unchanged catalog is a
// 304 with no body, nothing parsed, nothing rebuilt), parses the documents,
// flattens the sessions into rows, filters them and hands the page only the
// rows it shows. A catalog of 20,000 acquisitions (8 MB of JSON) never blocks
// the page.
//
// Messages in: {id, call, args}; out: {id, result} or {id, error: {status, detail, path}},
// and {log: record} for every request (the page's request log).
import { Api, ApiError } from "./api.js";

const heights = { session: 26, file: 62 };  // CSS pixels; viewer.css gives the rows these heights

const catalog = {
  sessions: [],
  complete: true,
  etag: null,  // of the sessions document last parsed
  acquisitionsEtag: null,
  readyToken: null,
  filter: { text: [], dtype: "", shape: "", date: "", resident: false },
  resident: new Set(),  // "session\nfile" of resident or loading acquisitions (the page tells)
  rows: [],  // visible rows after the filter: {kind: "session", path, date} | {kind: "file", session, file}
  files: 0,  // files in the catalog
  version: 0,  // bumped whenever rows change
};

let api = new Api(null, (record) => postMessage({ log: record }));

function conditional(etag) {
  return etag ? { "If-None-Match": etag } : {};
}

// GET sessions (refresh or partial); a 304 leaves everything as it is.
async function loadSessions({ refresh = false, partial = false } = {}) {
  const params = refresh ? { refresh: "true" } : partial ? { partial: "true" } : {};
  const { body, status, headers } = await api.request("/api/browse/sessions", params,
    { headers: conditional(catalog.etag), notModified: true });
  if (status === 304) return { changed: false, ...summary(false) };
  catalog.sessions = body.sessions || [];
  catalog.complete = body.complete !== false;
  catalog.etag = headers.get("etag");
  catalog.files = catalog.sessions.reduce((count, session) => count + (session.files || []).length, 0);
  rebuildRows();
  return { changed: true, ...summary() };
}

// The cheap poll: a 304 when nothing changed; a new ready_token rebuilds the catalog.
async function pollAcquisitions() {
  const { body, status, headers } = await api.request("/api/browse/acquisitions", {},
    { headers: conditional(catalog.acquisitionsEtag), notModified: true, quiet: true });
  if (status === 304) return { status, changed: false, ...summary(false) };
  catalog.acquisitionsEtag = headers.get("etag");
  const previous = catalog.readyToken;
  catalog.readyToken = body.ready_token;
  if (previous === null || previous === body.ready_token) return { status, changed: false, ...summary(false) };
  const reloaded = await loadSessions({ refresh: true });
  return { status, ...reloaded };
}

// What the page needs to know of the rows; with their offsets when they changed.
function summary(withOffsets = true) {
  return { complete: catalog.complete, files: catalog.files, shown: countFiles(), rows: catalog.rows.length,
           version: catalog.version, offsets: withOffsets ? offsets() : undefined };
}

function countFiles() {
  let count = 0;
  for (const row of catalog.rows) if (row.kind === "file") count++;
  return count;
}

// "name words dtype:uint16 shape:256x256 date:2026" -> the filter.
function parseFilter({ text = "", resident = false } = {}) {
  const filter = { text: [], dtype: "", shape: "", date: "", resident: Boolean(resident) };
  for (const word of String(text).toLowerCase().split(/\s+/).filter(Boolean)) {
    const colon = word.indexOf(":");
    const key = colon > 0 ? word.slice(0, colon) : "";
    if (key === "dtype" || key === "shape" || key === "date") filter[key] = word.slice(colon + 1);
    else filter.text.push(word);
  }
  return filter;
}

function fileMatches(session, file, filter) {
  if (filter.resident && !catalog.resident.has(`${session.path}\n${file.name}`)) return false;
  if (filter.dtype && String(file.dtype || "").toLowerCase() !== filter.dtype) return false;
  if (filter.shape) {
    const [sr, sc, dr, dc] = file.shape || [];
    const shapes = [`${sr}x${sc}`, `${dr}x${dc}`, `${sr}x${sc}x${dr}x${dc}`];
    if (!shapes.includes(filter.shape.replace(/×/g, "x"))) return false;
  }
  if (filter.date && !`${session.date || ""} ${session.path}`.toLowerCase().includes(filter.date)) return false;
  if (filter.text.length) {
    const haystack = `${session.path}/${file.name}`.toLowerCase();
    for (const word of filter.text) if (!haystack.includes(word)) return false;
  }
  return true;
}

function rebuildRows() {
  const rows = [];
  const filter = catalog.filter;
  for (const session of catalog.sessions) {
    let header = null;
    for (const file of session.files || []) {
      if (!fileMatches(session, file, filter)) continue;
      if (!header) {
        header = { kind: "session", path: session.path, date: session.date };
        rows.push(header);
      }
      rows.push({ kind: "file", session: session.path, file });
    }
  }
  catalog.rows = rows;
  catalog.version++;
}

// Row offsets (CSS pixels from the list's top), one more than the rows: the total height last.
function offsets() {
  const out = new Float64Array(catalog.rows.length + 1);
  let top = 0;
  for (let i = 0; i < catalog.rows.length; i++) {
    out[i] = top;
    top += heights[catalog.rows[i].kind];
  }
  out[catalog.rows.length] = top;
  return out;
}

function rowsBetween({ start, stop, version }) {
  if (version !== undefined && version !== catalog.version) return { version: catalog.version, stale: true, rows: [] };
  const first = Math.max(0, start);
  return { version: catalog.version, start: first, rows: catalog.rows.slice(first, Math.max(first, stop)) };
}

// The row of one acquisition (for keyboard steps and for revealing it), or -1.
function indexOf({ session, file }) {
  return catalog.rows.findIndex((row) => row.kind === "file" && row.session === session && row.file.name === file);
}

// The file row `step` files away from (session, file) in the shown rows.
function neighbour({ session, file, step }) {
  const files = [];
  for (let i = 0; i < catalog.rows.length; i++) if (catalog.rows[i].kind === "file") files.push(i);
  if (!files.length) return null;
  const at = files.findIndex((i) => catalog.rows[i].session === session && catalog.rows[i].file.name === file);
  const next = at < 0 ? (step > 0 ? 0 : files.length - 1) : Math.max(0, Math.min(files.length - 1, at + step));
  return { index: files[next], row: catalog.rows[files[next]] };
}

const calls = {
  init({ token }) {
    api = new Api(token, (record) => postMessage({ log: record }));
    return true;
  },
  loadSessions,
  pollAcquisitions,
  setFilter(args) {
    catalog.filter = parseFilter(args);
    rebuildRows();
    return summary();
  },
  setResident({ keys }) {
    catalog.resident = new Set(keys);
    if (!catalog.filter.resident) return null;
    rebuildRows();
    return summary();
  },
  rows: rowsBetween,
  indexOf,
  neighbour,
};

onmessage = async (event) => {
  const { id, call, args } = event.data;
  try {
    const result = await calls[call](args || {});
    if (result && result.offsets instanceof Float64Array) {
      postMessage({ id, result }, [result.offsets.buffer]);
    } else {
      postMessage({ id, result });
    }
  } catch (error) {
    // Not an ApiError: a fault here, reported as such (status -1), never as "no answer".
    const status = error instanceof ApiError ? error.status : -1;
    postMessage({ id, error: { status, detail: error.detail ?? String(error.message || error), path: error.path || "" } });
  }
};
