// The quantem-gpu browser viewer (docs/viewer.md): the catalog with readiness
// and residency, one acquisition's real-space image and diffraction patterns,
// the detector mask, regions, plan controls and each request's server-timing.
// Plain ES modules, canvas ImageData rendering, no framework.
import { Api, ApiError, LatestOnly, formatServerTiming } from "./api.js";
import { CatalogView, CatalogWorker, rowKey } from "./catalog.js";
import { colormapNames, cssColor, lookupTable } from "./colormaps.js";
import { clearedCanvas, displayValues, finiteRange, histogram, percentiles, renderInto } from "./imaging.js";
import { lineProfile, plotProfile, profileCsv, radialProfile } from "./profiles.js";
import {
  diffractionUnits, drawScaleBar, formatAngle, formatLength, formatQuantity, realspaceUnits, scaleBar,
} from "./units.js";

const $ = (id) => document.getElementById(id);

// Detector radii of each real-space mode, as fractions of the fitted
// bright-field radius R (the daemon's `inner`/`outer`); "annulus" is sent
// in absolute binned pixels (realspace-shape), starting from these multiples of R.
const modePresets = {
  BF: { inner: 0, outer: 1 },
  ABF: { inner: 0.5, outer: 1 },
  ADF: { inner: 1, outer: 3 },
  annulus: { inner: 1, outer: 2 },
};
const comModes = new Set(["CoMx", "CoMy", "CoMmag", "iCoM"]);
const signedModes = new Set(["CoMx", "CoMy", "iCoM"]);

// ---- the token: from the URL fragment only -------------------------------------

function takeToken() {
  const fragment = new URLSearchParams(location.hash.slice(1));
  const token = fragment.get("token");
  if (token) {
    // Off the address bar (screen sharing, history); kept for reloads of this tab only.
    sessionStorage.setItem("quantem-gpu-token", token);
    history.replaceState(null, "", location.pathname + location.search);
    return token;
  }
  return sessionStorage.getItem("quantem-gpu-token");
}

// ---- state ---------------------------------------------------------------------

const state = {
  token: takeToken(),
  capabilities: null,
  catalog: { complete: true, files: 0, shown: 0, builds: 0, lastPollStatus: null },
  residency: new Map(),  // "session\nfile" -> residency document
  current: null,  // {session, file, entry}
  generation: 0,  // bumped when the acquisition or the plan changes: older answers are dropped
  plan: { scan_bin: 1, det_bin: 1, crop: null },
  mode: "BF",
  fit: null,  // bright-field fit of the current plan {row, col, radius}, binned detector pixels
  mask: null,  // {row, col, inner, outer}: binned detector pixels
  maskCustom: false,  // the user moved the mask: requests carry it explicitly
  realspace: null,  // {image, route, params, drawnAt}
  products: null,  // {images, provenance, serverTiming}: the strip of thumbnails
  diffraction: null,  // {image, route, params, source}
  pinned: { kind: "mean" },  // what the diffraction panel shows when the pointer is elsewhere
  hover: null,
  drag: null,
  regionPreview: null,
  stopped: false,
  metadata: null,  // {key, pending, doc, error}: the open acquisition's GET /api/browse/metadata
  requests: [],  // every request's record, for the log (and tests)
  frames: { realspace: 0, diffraction: 0, products: 0 },
  drawMs: { realspace: null, diffraction: null },
  scaleBars: { realspace: null, diffraction: null },  // where each bar was drawn (tests read it)
  display: {},  // display settings per product and for the diffraction panel (displaySettings)
  view: { realspace: { zoom: 1, tx: 0, ty: 0 }, diffraction: { zoom: 1, tx: 0, ty: 0 } },  // zoom and pan
  pan: null,
};

const api = new Api(state.token, logRequest);
const catalogWorker = new CatalogWorker(logRequest);
let catalogView = null;  // made in start(), once the page exists

// ---- messages --------------------------------------------------------------------

function showBanner(text, kind = "error") {
  const banner = $("banner");
  banner.textContent = text;
  banner.dataset.kind = kind;
  banner.className = `banner ${kind === "info" ? "info" : "error"}`;
  banner.hidden = false;
}

function clearBanner(kind) {
  const banner = $("banner");
  if (!kind || banner.dataset.kind === kind) banner.hidden = true;
}

// A 403 is either the Host rule or the token; both are explained in full.
function explainError(error) {
  if (!(error instanceof ApiError)) return String(error && error.message ? error.message : error);
  const detail = typeof error.detail === "string" ? error.detail : JSON.stringify(error.detail);
  if (error.status === 403 && /token/i.test(detail)) {
    state.stopped = true;
    if (state.token) {
      showBanner(
        "The daemon refused the token in this page's address (403). Open the viewer again as " +
          `${location.origin}/#token=<token>, with the token from the daemon's runtime file ` +
          "(server-<pid>.json in $QUANTEM_GPU_RUNTIME_DIR or $XDG_RUNTIME_DIR/quantem-gpu).",
        "token-rejected",
      );
    } else {
      showBanner(
        "This daemon runs with --auth token: open the viewer as " +
          `${location.origin}/#token=<token>, with the token from the daemon's runtime file ` +
          "(server-<pid>.json in $QUANTEM_GPU_RUNTIME_DIR or $XDG_RUNTIME_DIR/quantem-gpu).",
        "token-required",
      );
    }
    $("auth-info").textContent = state.token ? "token: refused" : "token: none";
    $("daemon-info").textContent = "not connected";
    if (catalogView) {
      catalogView.setRows({ version: -2, offsets: new Float64Array(1) });
      catalogView.setNotes([note("Nothing to show without a valid token.")]);
    }
    return null;
  }
  if (error.status === 403) {
    showBanner(`The daemon refused this page: ${detail}`, "forbidden");
    return null;
  }
  return error.status ? `${error.status}: ${detail}` : detail;
}

function reportError(error, where) {
  if (error && error.name === "AbortError") return;
  // No answer at all: the connection banner says so (and retries); no second banner.
  if (error instanceof ApiError && error.status === 0 && !where) return;
  const text = explainError(error);
  if (text === null) return;
  if (where) {
    where.textContent = text;
    where.classList.add("error-text");
  } else {
    showBanner(text);
  }
}

function setStatus(element, text) {
  element.textContent = text;
  element.classList.remove("error-text");
}

// ---- the request log ---------------------------------------------------------------

function logRequest(record) {
  record.at = performance.now();
  state.requests.push(record);
  if (!record.status) connectionLost({ message: "no answer" });
  else connectionRestored();
  if (state.requests.length > 500) state.requests.splice(0, state.requests.length - 500);
  if (record.quiet && record.status && record.status < 400) return;  // polls stay out of the table unless they fail
  const body = $("request-log");
  const row = document.createElement("tr");
  const route = record.path.replace(/^\/api\/browse\//, "").replace(/^\/api\//, "");
  const cells = [
    `${record.method === "GET" ? "" : record.method + " "}${route}`,
    record.status || "failed",
    record.bytes ? formatBytes(record.bytes) : "",
    `${record.clientMs.toFixed(1)} ms`,
    formatServerTiming(record.serverTiming),
  ];
  for (const text of cells) {
    const cell = document.createElement("td");
    cell.textContent = String(text);
    row.appendChild(cell);
  }
  row.title = record.query;
  row.dataset.url = record.query;
  if (record.status >= 400 || !record.status) row.className = "failed";
  body.insertBefore(row, body.firstChild);
  while (body.childElementCount > 16) body.removeChild(body.lastChild);
}

function formatBytes(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  if (bytes < 1024 ** 3) return `${(bytes / 1024 ** 2).toFixed(1)} MiB`;
  return `${(bytes / 1024 ** 3).toFixed(2)} GiB`;
}

function formatValue(value) {
  if (!Number.isFinite(value)) return String(value);
  if (Number.isInteger(value)) return String(value);
  const magnitude = Math.abs(value);
  return magnitude !== 0 && (magnitude < 1e-3 || magnitude >= 1e5) ? value.toExponential(3) : value.toPrecision(4);
}

// ---- the catalog -------------------------------------------------------------------

const residencyKey = rowKey;

// The daemon stopped answering: one probe at a time, 0.5 s, 1 s, 2 s, ... up
// to 10 s apart, background polls paused; the first answer clears the banner
// and reloads what the page shows.
const connection = { down: false, failures: 0, timer: null, delays: [] };
const maxProbeDelayMs = 10000;

function connectionLost(error) {
  if (connection.down) return;
  connection.down = true;
  connection.failures = 0;
  connection.delays = [];  // each probe's wait, in order (the test reads them)
  connection.reason = error && error.message ? error.message : "no answer";
  scheduleProbe();
}

function scheduleProbe() {
  const delay = Math.min(maxProbeDelayMs, 500 * 2 ** connection.failures);
  connection.failures++;
  connection.delays.push(delay);
  showBanner(`The daemon does not answer (${connection.reason}); is it still running? Trying again in ` +
    `${(delay / 1000).toFixed(delay < 1000 ? 1 : 0)} s.`, "connection");
  clearTimeout(connection.timer);
  connection.timer = setTimeout(probeConnection, delay);
}

async function probeConnection() {
  if (!connection.down) return;
  try {
    await api.request("/api/health/live", {}, { quiet: true });
  } catch (error) {
    // Any answer, even an error status, means the daemon is back (logRequest
    // saw it and called connectionRestored); no answer: wait longer.
    if (!(error instanceof ApiError) || error.status === 0) scheduleProbe();
    return;
  }
  // logRequest saw the answer and called connectionRestored.
}

function connectionRestored() {
  if (!connection.down) return;
  connection.down = false;
  clearTimeout(connection.timer);
  clearBanner("connection");
  loadCapabilities();
  loadSessions(false);
  pollResidency();
}

async function loadCapabilities() {
  try {
    const { body } = await api.request("/api/browse/capabilities");
    state.capabilities = body;
    const devices = (body.devices || []).map((d) => d.name || `device ${d.index}`).join(", ");
    const revision = body.implementation_revision ? String(body.implementation_revision).slice(0, 12) : "";
    const folders = (body.data_folders || []).join(", ");
    $("daemon-info").textContent = [`${body.backend || "?"} backend`, devices, revision, folders]
      .filter(Boolean).join(" · ");
    $("auth-info").textContent = state.token ? "token: accepted" : "";
  } catch (error) {
    if (!(error instanceof ApiError) || error.status !== 0) reportError(error);
  }
}

// An error the worker reported, as the ApiError the page's handlers expect.
function workerError(error) {
  if (error instanceof Error) return error;
  if (error.status === -1) return new Error(`the catalog worker failed: ${error.detail}`);
  if (error.status === 0) return new ApiError(0, `the daemon did not answer (${error.detail}); is it still running?`, error.path);
  return new ApiError(error.status, error.detail, error.path);
}

let sessionsTimer = null;
async function loadSessions(refresh) {
  clearTimeout(sessionsTimer);
  try {
    // partial: while the daemon is still cataloguing, the list known so far (complete: false).
    const summary = await catalogWorker.call("loadSessions", refresh ? { refresh: true } : { partial: true });
    acceptCatalog(summary);
    if (!state.catalog.complete && !state.stopped) sessionsTimer = setTimeout(() => loadSessions(false), 1000);
  } catch (caught) {
    const error = workerError(caught);
    if (error.status === 0) return;  // the connection banner says it
    const text = explainError(error);
    if (text !== null) catalogView.setNotes([note(`The catalog could not be read: ${text}`, "catalog-error")]);
  }
}

// The cheap poll: a 304 when nothing changed; a changed ready_token rebuilds the catalog.
async function pollAcquisitions() {
  if (state.stopped || connection.down) return;
  try {
    const summary = await catalogWorker.call("pollAcquisitions");
    state.catalog.lastPollStatus = summary.status;
    if (summary.changed) acceptCatalog(summary);
  } catch (caught) {
    const error = workerError(caught);
    if (error.status !== 0) reportError(error);
  }
}

function note(text, id) {
  const element = document.createElement("p");
  element.className = "muted";
  if (id) element.id = id;
  element.textContent = text;
  return element;
}

// A worker summary: {changed, complete, files, shown, rows, version, offsets}.
function acceptCatalog(summary) {
  const started = performance.now();
  state.catalog.complete = summary.complete;
  state.catalog.files = summary.files;
  state.catalog.shown = summary.shown;
  const notes = [];
  if (!summary.complete) {
    notes.push(note("Still cataloguing the data folder: the list grows as acquisitions are inspected.",
      "cataloguing-note"));
  }
  if (summary.complete && !summary.files) notes.push(note("No acquisitions (*_master.h5) in the data folder yet."));
  else if (summary.files && summary.shown !== summary.files) {
    notes.push(note(`${summary.shown} of ${summary.files} acquisitions match the filter.`, "filter-count"));
  }
  catalogView.setNotes(notes);
  $("catalog-count").textContent = summary.files ? String(summary.files) : "";
  if (!summary.offsets || (summary.changed === false && summary.version === catalogView.version)) return;
  catalogView.setRows(summary);
  state.catalog.builds++;
  state.catalog.acceptMs = performance.now() - started;  // the page's own work for a new row set (benchmark)
}

function renderCatalogRow(row) {
  if (row.kind === "session") {
    const title = document.createElement("h3");
    title.className = "session-row";
    title.textContent = row.path;
    title.title = row.path;
    return title;
  }
  const { session, file } = row;
  const item = document.createElement("button");
  item.type = "button";
  item.className = "acquisition";
  item.dataset.session = session;
  item.dataset.file = file.name;
  if (state.current && state.current.session === session && state.current.file === file.name) {
    item.classList.add("selected");
  }
  const name = document.createElement("span");
  name.className = "name";
  name.textContent = file.name.replace(/_master\.h5$/, "");
  const meta = document.createElement("span");
  meta.className = "meta";
  const [sr, sc, dr, dc] = file.shape || [0, 0, 0, 0];
  meta.textContent = `${sr}×${sc} scan · ${dr}×${dc} ${file.dtype || "?"} · ${file.size || ""}`;
  const badges = document.createElement("span");
  badges.className = "badges";
  const ready = document.createElement("span");
  ready.className = `badge ${file.loadable ? "ok" : "warn"}`;
  ready.textContent = file.loadable ? "ready" : "not ready";
  ready.title = (file.load_status && file.load_status.reason) || "";
  const residency = document.createElement("span");
  residency.className = "badge residency-badge";
  badges.append(ready, residency);
  item.append(name, meta, badges);
  item.title = `${session}/${file.name}${ready.title ? `: ${ready.title}` : ""}`;
  item.addEventListener("click", () => openAcquisition(session, file.name, file));
  paintResidencyBadge(residency, state.residency.get(residencyKey(session, file.name)));
  return item;
}

function residencyText(doc) {
  if (!doc) return { text: "", kind: "" };
  switch (doc.state) {
    case "resident":
      return { text: doc.device === null ? "resident" : `resident · device ${doc.device}`, kind: "ok" };
    case "loading": {
      const fraction = doc.bytes_total ? doc.bytes_done / doc.bytes_total : 0;
      // A region-first load answers crops of the rows it holds already.
      const rows = doc.scan_rows_resident ? ` · ${doc.scan_rows_resident}/${doc.scan_rows} rows` : "";
      return {
        text: `loading ${Math.round(fraction * 100)}%${doc.stage ? ` · ${doc.stage}` : ""}${rows}`,
        kind: "busy",
      };
    }
    case "failed":
      return { text: "load failed", kind: "warn" };
    default:
      return { text: "on disk", kind: "" };
  }
}

function paintResidencyBadge(badge, doc) {
  const { text, kind } = residencyText(doc);
  badge.textContent = text;
  badge.className = `badge residency-badge ${kind}`;
  badge.title = doc && doc.failure_reason ? doc.failure_reason : "";
  badge.hidden = !text;
}

// O(1): the rendered row is found by key; rows out of view are painted when they are drawn.
function updateResidencyBadge(session, file) {
  const doc = state.residency.get(residencyKey(session, file));
  const item = catalogView.element(session, file);
  if (item) paintResidencyBadge(item.querySelector(".residency-badge"), doc);
  if (state.current && state.current.session === session && state.current.file === file) {
    if ($("metadata-panel").open) showMetadata();
    const { text, kind } = residencyText(doc);
    const element = $("residency-state");
    element.textContent = text || "on disk";
    element.className = `badge ${kind}`;
    element.title = doc && doc.failure_reason ? doc.failure_reason : "";
    const progress = $("residency-progress");
    progress.hidden = !doc || doc.state !== "loading";
    if (doc && doc.bytes_total) progress.value = doc.bytes_done / doc.bytes_total;
  }
}

async function fetchResidency(session, file) {
  const { body } = await api.request("/api/browse/residency", { session, file }, { quiet: true });
  const key = residencyKey(session, file);
  const before = state.residency.get(key);
  state.residency.set(key, body);
  updateResidencyBadge(session, file);
  if ((before && before.state) !== body.state) shareResidentKeys();
  return body;
}

// The resident filter is the worker's; it learns what is resident from here.
function shareResidentKeys() {
  const keys = [];
  for (const [key, doc] of state.residency) if (doc.state === "resident" || doc.state === "loading") keys.push(key);
  catalogWorker.call("setResident", { keys }).then((summary) => summary && acceptCatalog(summary), () => {});
}

// Residency of the acquisitions in view and of the one open, every few seconds.
let residencyPollRunning = false;
async function pollResidency() {
  if (residencyPollRunning || state.stopped || connection.down) return;
  residencyPollRunning = true;
  try {
    const keys = new Set(catalogView.visibleKeys());
    if (state.current) keys.add(residencyKey(state.current.session, state.current.file));
    for (const key of keys) {
      const [session, file] = key.split("\n");
      await fetchResidency(session, file);
    }
  } catch (error) {
    if (!(error instanceof ApiError) || error.status !== 0) reportError(error);
  } finally {
    residencyPollRunning = false;
  }
}

// Rows scrolled into view whose residency the page has not asked yet: asked
// once the scrolling pauses (at most the rows in view).
let newRowsTimer = null;
function residencyOfNewRows() {
  clearTimeout(newRowsTimer);
  newRowsTimer = setTimeout(async () => {
    if (state.stopped || connection.down) return;
    for (const key of catalogView.visibleKeys()) {
      if (state.residency.has(key)) continue;
      const [session, file] = key.split("\n");
      try {
        await fetchResidency(session, file);
      } catch (error) {
        return;
      }
    }
  }, 150);
}

// Follows the open acquisition's residency while it loads: a crop drawn from
// a loading acquisition shows its rows, and the badge ends on "resident".
let followingResidency = null;
async function followResidency() {
  if (!state.current) return;
  const { session, file } = state.current;
  const key = residencyKey(session, file);
  if (followingResidency === key) return;
  followingResidency = key;
  try {
    for (;;) {
      if (!state.current || residencyKey(state.current.session, state.current.file) !== key) return;
      const doc = await fetchResidency(session, file);
      if (doc.state !== "loading") return;
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  } catch (error) {
    // the connection banner or the next poll says it
  } finally {
    if (followingResidency === key) followingResidency = null;
  }
}

// ---- one acquisition ------------------------------------------------------------------

function planParams(overrides = {}) {
  const { session, file } = state.current;
  const params = { session, file, scan_bin: state.plan.scan_bin, det_bin: state.plan.det_bin };
  const crop = overrides.crop !== undefined ? overrides.crop : state.plan.crop;
  if (crop) {
    params.row_start = crop.row_start;
    params.row_stop = crop.row_stop;
    params.column_start = crop.column_start;
    params.column_stop = crop.column_stop;
  }
  return params;
}

async function openAcquisition(session, file, entry) {
  state.current = { session, file, entry };
  state.metadata = null;  // read again when the panel shows it (the files may have changed)
  state.generation++;
  state.plan = { scan_bin: 1, det_bin: 1, crop: null };
  readPlanIntoForm();
  resetPlanDependentState();
  clearExportStatus();
  for (const item of document.querySelectorAll(".acquisition.selected")) item.classList.remove("selected");
  const item = catalogView.element(session, file);
  if (item) item.classList.add("selected");
  $("empty-workspace").hidden = true;
  $("acquisition-view").hidden = false;
  $("acquisition-title").textContent = file;
  const [sr, sc, dr, dc] = (entry && entry.shape) || [0, 0, 0, 0];
  const calibration = entry && entry.scan_sampling_A > 0 ? `scan step ${formatLength(entry.scan_sampling_A)}` : "scan uncalibrated";
  const kCalibration = entry && entry.k_pixel_size_mrad > 0 ? `detector pixel ${formatAngle(entry.k_pixel_size_mrad)}`
    : "detector uncalibrated";
  $("acquisition-meta").textContent =
    `${session} · scan ${sr}×${sc} · detector ${dr}×${dc} ${(entry && entry.dtype) || ""} · ${(entry && entry.size) || ""}` +
    ` · ${calibration} · ${kCalibration}`;
  clearCanvas("realspace");
  clearCanvas("diffraction");
  updateResidencyBadge(session, file);
  showMetadata();
  if (entry && !entry.loadable) {
    const reason = (entry.load_status && entry.load_status.reason) || "not ready";
    setStatus($("realspace-status"), `Not ready: ${reason}`);
    return;
  }
  await loadAndShow();
}

function resetPlanDependentState() {
  state.fit = null;
  state.mask = null;
  state.maskCustom = false;
  state.realspace = null;
  state.products = null;
  $("product-strip").replaceChildren();
  state.diffraction = null;
  state.pinned = { kind: "mean" };
  state.hover = null;
  state.regionPreview = null;
  state.line = null;
  state.profile = null;
  $("profile-panel").hidden = true;
}

// Starts the load (POST /load), follows its progress, then asks for the images.
async function loadAndShow() {
  const { session, file } = state.current;
  const generation = state.generation;
  setStatus($("realspace-status"), "Loading…");
  try {
    const { body } = await api.request("/api/browse/load", { session, file }, { method: "POST" });
    state.residency.set(residencyKey(session, file), body);
    updateResidencyBadge(session, file);
    let doc = body;
    while (doc.state === "loading" && generation === state.generation) {
      await new Promise((resolve) => setTimeout(resolve, 250));
      doc = await fetchResidency(session, file);
    }
    if (generation !== state.generation) return;
    if (doc.state === "failed") {
      $("realspace-status").textContent = `The load failed: ${doc.failure_reason || "no reason given"}`;
      $("realspace-status").classList.add("error-text");
      return;
    }
  } catch (error) {
    if (generation === state.generation) reportError(error, $("realspace-status"));
    return;
  }
  requestRealspace();
}

// ---- real space ---------------------------------------------------------------------

function realspaceRequest() {
  const mode = state.mode;
  if (mode === "annulus") {
    const mask = state.mask || defaultMask();
    return {
      route: "/api/browse/realspace-shape",
      params: { ...planParams(), shape: "annulus", cx: round(mask.col, 3), cy: round(mask.row, 3),
                inner: round(mask.inner, 3), outer: round(mask.outer, 3) },
    };
  }
  const params = { ...planParams(), mode, ensure_resident: "true" };
  const preset = modePresets[mode];
  if (preset) {
    if (state.maskCustom && state.mask && state.fit) {
      params.cx = round(state.mask.col, 3);
      params.cy = round(state.mask.row, 3);
      params.inner = round(state.mask.inner / state.fit.radius, 5);
      params.outer = round(state.mask.outer / state.fit.radius, 5);
    } else {
      params.inner = preset.inner;
      params.outer = preset.outer;
    }
  }
  return { route: "/api/browse/realspace", params };
}

function round(value, digits) {
  return Number(value.toFixed(digits));
}

// Binned detector shape of the current plan.
function detectorShape() {
  const shape = (state.current.entry && state.current.entry.shape) || [0, 0, 0, 0];
  const b = state.plan.det_bin;
  return [Math.ceil(shape[2] / b), Math.ceil(shape[3] / b)];
}

function defaultMask() {
  const [rows, cols] = detectorShape();
  const radius = state.fit ? state.fit.radius : Math.min(rows, cols) / 4;
  const preset = modePresets[state.mode] || modePresets.BF;
  return {
    row: state.fit ? state.fit.row : rows / 2,
    col: state.fit ? state.fit.col : cols / 2,
    inner: preset.inner * radius,
    outer: preset.outer * radius,
  };
}

const realspaceChannel = new LatestOnly(
  async ({ route, params, generation }) => {
    const result = await api.request(route, params, { kind: "array" });
    return { ...result, route, params, generation };
  },
  (result, error, args) => {
    if (args.generation !== state.generation) return;
    if (error) {
      reportError(error, $("realspace-status"));
      return;
    }
    acceptRealspace(result);
  },
);

function requestRealspace() {
  if (!state.current) return;
  const { route, params } = realspaceRequest();
  setStatus($("realspace-status"), state.realspace ? "" : "Computing…");
  realspaceChannel.request({ route, params, generation: state.generation });
}

function acceptRealspace(result) {
  const image = result.body;
  const geometry = image.provenance && image.provenance.geometry;
  if (geometry && geometry.bright_field) {
    const bf = geometry.bright_field;
    state.fit = { row: bf.center_row, col: bf.center_col, radius: bf.radius };
  }
  if (!state.maskCustom && geometry && modePresets[state.mode] && geometry.center_row !== null &&
      geometry.center_row !== undefined && geometry.outer_radius_px !== null) {
    state.mask = {
      row: geometry.center_row,
      col: geometry.center_col,
      inner: geometry.inner_radius_px || 0,
      outer: geometry.outer_radius_px,
    };
  } else if (!state.mask && state.fit) {
    state.mask = defaultMask();
  }
  const doc = state.residency.get(residencyKey(state.current.session, state.current.file));
  if (!doc || doc.state !== "resident") followResidency();
  const firstForPlan = !state.realspace;
  if (firstForPlan) setTimeout(showMetadata, 0);
  state.realspace = { image, route: result.route, params: result.params, serverTiming: result.serverTiming };
  drawRealspace();
  drawDiffractionOverlay();
  updateMaskReadout();
  if (firstForPlan) {
    requestDiffraction(state.pinned);
    requestProducts();
  }
}

// ---- the product strip: every mode of the plan from ONE products request ----------------

const productModes = ["BF", "ABF", "ADF", "CoMx", "CoMy", "iCoM"];

function productsParams() {
  const params = { ...planParams(), modes: productModes.join(","), ensure_resident: "true", format: "raw" };
  for (const mode of ["BF", "ABF", "ADF"]) {
    params[`inner_${mode}`] = modePresets[mode].inner;
    params[`outer_${mode}`] = modePresets[mode].outer;
  }
  return params;
}

async function requestProducts() {
  if (!state.current) return;
  const generation = state.generation;
  try {
    const { body, serverTiming } = await api.request("/api/browse/products", productsParams(), { kind: "bundle" });
    if (generation !== state.generation) return;
    state.products = { ...body, serverTiming };
    drawProducts();
  } catch (error) {
    if (generation === state.generation) reportError(error, $("realspace-status"));
  }
}

function drawProducts() {
  const strip = $("product-strip");
  strip.replaceChildren();
  for (const image of state.products.images) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "product-thumb";
    button.dataset.mode = image.mode;
    button.title = `${image.mode} · ${image.height}×${image.width} ${image.dtype}: show it`;
    const canvas = document.createElement("canvas");
    const values = image.divisor === 1 ? image.data : displayValues(image.data, image.divisor);
    let [low, high] = percentiles(values, [0.5, 99.5]);
    if (!(high > low)) [low, high] = finiteRange(values);
    paint(canvas, values, image.width, image.height, low, high,
      lookupTable(signedModes.has(image.mode) ? "coolwarm" : "gray"));
    const label = document.createElement("span");
    label.textContent = image.mode;
    button.append(canvas, label);
    button.addEventListener("click", () => {
      $("mode-select").value = image.mode;
      modeChanged();
    });
    strip.appendChild(button);
  }
  markActiveProduct();
  state.frames.products++;
  strip.dataset.frame = String(state.frames.products);
}

function markActiveProduct() {
  for (const button of document.querySelectorAll(".product-thumb")) {
    button.classList.toggle("active", button.dataset.mode === state.mode);
  }
}

// ---- contrast by hand: per product, limits dragged on the histogram, gamma or log ----

// Display settings of each product (BF, ADF, ...) and of the diffraction panel:
// percentile limits, or limits dragged on the histogram (manual, in displayed
// values), the scale (linear, log10(1 + v), gamma) and the colour map.
function displaySettings(key) {
  if (!state.display[key]) {
    state.display[key] = key === "diffraction"
      ? { low: 0, high: 99.9, manual: null, scale: "log", gamma: 1, colormap: "inferno" }
      : { low: 0.5, high: 99.5, manual: null, scale: "linear", gamma: 1,
          colormap: signedModes.has(key) ? "coolwarm" : "gray" };
  }
  return state.display[key];
}

// The settings of the image drawn (while a new product is on its way, the one still shown).
function realspaceDisplayKey() {
  return state.realspace ? realspaceKind() : state.mode;
}

// The form shows the settings of the product on screen.
function settingsToForm() {
  const settings = displaySettings(state.mode);
  $("realspace-low").value = settings.low;
  $("realspace-high").value = settings.high;
  $("realspace-colormap").value = settings.colormap;
  $("realspace-scale").value = settings.scale;
  $("realspace-gamma").value = settings.gamma;
  $("realspace-gamma").disabled = settings.scale !== "gamma";
}

function formToSettings(event) {
  const settings = displaySettings(state.mode);  // the form shows the chosen product's settings
  const changed = event && event.target ? event.target.id : "";
  settings.low = Number($("realspace-low").value);
  settings.high = Number($("realspace-high").value);
  settings.colormap = $("realspace-colormap").value;
  settings.gamma = Math.max(0.05, Number($("realspace-gamma").value) || 1);
  if (settings.scale !== $("realspace-scale").value) settings.manual = null;  // limits are in displayed values
  settings.scale = $("realspace-scale").value;
  if (changed === "realspace-low" || changed === "realspace-high") settings.manual = null;
  $("realspace-gamma").disabled = settings.scale !== "gamma";
  drawRealspace();
}

function diffractionFormToSettings(event) {
  const settings = displaySettings("diffraction");
  const scale = $("diffraction-log").checked ? "log" : "linear";
  if (scale !== settings.scale || (event && event.target && event.target.id === "diffraction-high")) settings.manual = null;
  settings.scale = scale;
  settings.high = Number($("diffraction-high").value);
  settings.colormap = $("diffraction-colormap").value;
  drawDiffraction();
}

// Limits of displayed values: the manual ones, else the percentiles (else the range).
function displayLimits(values, settings, percents) {
  if (settings.manual) return settings.manual;
  let [low, high] = percents ? percentiles(values, percents) : [NaN, NaN];
  if (!(high > low)) [low, high] = finiteRange(values);
  return [low, high];
}

// A colour table with gamma applied: level L shows the colour of 255 (L/255)^gamma.
const gammaTables = new Map();
function tableFor(colormap, scale, gamma) {
  const table = lookupTable(colormap);
  if (scale !== "gamma" || gamma === 1) return table;
  const key = `${colormap} ${gamma}`;
  if (gammaTables.has(key)) return gammaTables.get(key);
  const out = new Uint8Array(256 * 4);
  for (let level = 0; level < 256; level++) {
    const source = Math.round(255 * (level / 255) ** gamma) * 4;
    out.set(table.subarray(source, source + 4), level * 4);
  }
  gammaTables.set(key, out);
  return out;
}

function drawRealspace() {
  const started = performance.now();
  const realspace = state.realspace;
  if (!realspace) return;
  const { image } = realspace;
  const settings = displaySettings(realspaceKind());
  const values = image.divisor === 1 && settings.scale !== "log" ? image.data
    : displayValues(image.data, image.divisor, settings.scale === "log");
  const [lowValue, highValue] = displayLimits(values, settings, [settings.low, settings.high]);
  realspace.limits = [lowValue, highValue];
  realspace.values = values;
  const canvas = $("realspace-canvas");
  const table = tableFor(settings.colormap, settings.scale, settings.gamma);
  paint(canvas, values, image.width, image.height, lowValue, highValue, table);
  layoutStack("realspace", image.width, image.height);
  drawRealspaceOverlay();
  drawHistogram($("realspace-histogram"), values, lowValue, highValue, settings.colormap);
  drawColorBar($("realspace-colorbar"), table, lowValue, highValue, settings);
  if (state.profile && state.profile.kind === "line" && state.line) showLineProfile();
  state.drawMs.realspace = performance.now() - started;
  state.frames.realspace++;
  canvas.dataset.frame = String(state.frames.realspace);
  const mode = realspaceKind();
  const how = `${settings.manual ? "manual" : "percentile"} limits` +
    `${settings.scale === "log" ? ", log10(1 + v)" : settings.scale === "gamma" ? `, gamma ${settings.gamma}` : ""}`;
  $("realspace-status").textContent = "";
  $("realspace-readout").textContent =
    `${mode} · ${image.height}×${image.width} ${image.dtype} · ${how} ${formatValue(lowValue)} – ${formatValue(highValue)}` +
    ` · server-timing ${formatServerTiming(realspace.serverTiming)} · drawn in ${state.drawMs.realspace.toFixed(1)} ms`;
}

// The colour bar: the table from the low limit to the high one, with both values.
function drawColorBar(canvas, table, low, high, settings) {
  const { context, cssWidth, cssHeight } = clearedCanvas(canvas, 480, 30);
  const barHeight = 12;
  for (let x = 0; x < cssWidth; x++) {
    const level = Math.min(255, Math.floor((x / Math.max(1, cssWidth - 1)) * 255)) * 4;
    context.fillStyle = `rgb(${table[level]},${table[level + 1]},${table[level + 2]})`;
    context.fillRect(x, 0, 1, barHeight);
  }
  context.fillStyle = "#9aa4b2";
  context.font = "10px system-ui, sans-serif";
  context.textBaseline = "top";
  const scale = settings.scale === "log" ? "log10(1 + v) " : "";
  const lowText = `${scale}${formatValue(low)}`;
  const highText = formatValue(high);
  context.fillText(lowText, 0, barHeight + 2);
  context.fillText(highText, cssWidth - context.measureText(highText).width, barHeight + 2);
  canvas.dataset.low = String(low);
  canvas.dataset.high = String(high);
}

// Dragging on a histogram moves the nearer limit to the value under the pointer.
function histogramPointer(which) {
  const canvas = $(`${which}-histogram`);
  const valueAt = (event) => {
    const range = canvas.range;
    const rect = canvas.getBoundingClientRect();
    const fraction = Math.max(0, Math.min(1, (event.clientX - rect.left) / rect.width));
    return range[0] + fraction * (range[1] - range[0]);
  };
  const target = () => (which === "realspace" ? state.realspace : state.diffraction);
  const settingsOf = () => displaySettings(which === "realspace" ? realspaceDisplayKey() : "diffraction");
  let dragging = null;
  const apply = (event) => {
    const value = valueAt(event);
    const limits = target().limits;
    const settings = settingsOf();
    settings.manual = dragging === "low" ? [Math.min(value, limits[1]), limits[1]] : [limits[0], Math.max(value, limits[0])];
    if (which === "realspace") drawRealspace();
    else drawDiffraction();
  };
  canvas.addEventListener("pointerdown", (event) => {
    if (!target() || !canvas.range || event.button !== 0) return;
    const value = valueAt(event);
    const limits = target().limits;
    dragging = Math.abs(value - limits[0]) <= Math.abs(value - limits[1]) ? "low" : "high";
    canvas.setPointerCapture(event.pointerId);
    apply(event);
  });
  canvas.addEventListener("pointermove", (event) => {
    if (dragging) apply(event);
  });
  const stop = () => {
    dragging = null;
  };
  canvas.addEventListener("pointerup", stop);
  canvas.addEventListener("pointercancel", stop);
}

const imageDataCache = new WeakMap();

function paint(canvas, values, width, height, low, high, table) {
  if (canvas.width !== width || canvas.height !== height) {
    canvas.width = width;
    canvas.height = height;
  }
  const context = canvas.getContext("2d");
  let imageData = imageDataCache.get(canvas);
  if (!imageData || imageData.width !== width || imageData.height !== height) {
    imageData = context.createImageData(width, height);
    imageDataCache.set(canvas, imageData);
  }
  renderInto(imageData, values, low, high, table);
  context.putImageData(imageData, 0, 0);
}

function clearCanvas(which) {
  const canvas = $(`${which}-canvas`);
  canvas.width = 1;
  canvas.height = 1;
  const overlay = $(`${which}-overlay`);
  overlay.getContext("2d").clearRect(0, 0, overlay.width, overlay.height);
  $(`${which}-histogram`).getContext("2d").clearRect(0, 0, 10000, 10000);
  $(which === "realspace" ? "realspace-readout" : "mask-readout").textContent = "";
  if (which === "diffraction") $("diffraction-source").textContent = "";
}

// Fits the image into its box keeping square pixels; the overlay gets the
// displayed size in device pixels so lines stay sharp.
function layoutStack(which, width, height) {
  const stack = $(`${which}-stack`);
  const box = stack.parentElement;
  const available = Math.max(64, Math.min(box.clientWidth, box.clientHeight || box.clientWidth));
  const scale = available / Math.max(width, height);
  const cssWidth = Math.max(1, Math.round(width * scale));
  const cssHeight = Math.max(1, Math.round(height * scale));
  if (stack.style.width !== `${cssWidth}px` || stack.style.height !== `${cssHeight}px`) {
    state.view[which] = { zoom: 1, tx: 0, ty: 0 };  // another image shape or box: fit again
    $(`${which}-canvas`).style.transform = "";
    stack.dataset.zoom = "1";
  }
  stack.style.width = `${cssWidth}px`;
  stack.style.height = `${cssHeight}px`;
  const overlay = $(`${which}-overlay`);
  const ratio = window.devicePixelRatio || 1;
  const overlayWidth = Math.round(cssWidth * ratio);
  const overlayHeight = Math.round(cssHeight * ratio);
  if (overlay.width !== overlayWidth || overlay.height !== overlayHeight) {
    overlay.width = overlayWidth;
    overlay.height = overlayHeight;
  }
}

function drawHistogram(canvas, values, low, high, colormap) {
  const { context, cssWidth, cssHeight } = clearedCanvas(canvas, 480, 70);
  const [min, max] = finiteRange(values);
  canvas.range = Number.isFinite(min) ? [min, max] : null;
  if (!Number.isFinite(min)) return;
  const bins = Math.min(160, Math.max(16, Math.floor(cssWidth / 3)));
  const counts = histogram(values, bins, min, max);
  let peak = 0;
  for (const count of counts) peak = Math.max(peak, count);
  const barWidth = cssWidth / bins;
  const plotHeight = cssHeight - 14;
  for (let bin = 0; bin < bins; bin++) {
    if (!counts[bin]) continue;
    // Square-root counts: the tails stay visible next to a dominant peak.
    const height = Math.max(1, (Math.sqrt(counts[bin]) / Math.sqrt(peak)) * plotHeight);
    const centre = min + ((bin + 0.5) / bins) * (max - min);
    const level = high > low ? (centre - low) / (high - low) : 0.5;
    context.fillStyle = cssColor(colormap, Math.max(0.08, Math.min(1, level)));
    context.fillRect(bin * barWidth, plotHeight - height, Math.max(1, barWidth - 0.5), height);
  }
  const toX = (value) => (max > min ? ((value - min) / (max - min)) * cssWidth : 0);
  context.strokeStyle = "#f2b33d";
  context.lineWidth = 1.5;
  for (const value of [low, high]) {
    const x = Math.min(cssWidth - 1, Math.max(1, toX(value)));
    context.beginPath();
    context.moveTo(x, 0);
    context.lineTo(x, plotHeight);
    context.stroke();
  }
  context.fillStyle = "#9aa4b2";
  context.font = "10px system-ui, sans-serif";
  context.textBaseline = "bottom";
  context.fillText(formatValue(min), 2, cssHeight);
  const maxText = formatValue(max);
  context.fillText(maxText, cssWidth - context.measureText(maxText).width - 2, cssHeight);
}

// Pointer position in image pixel coordinates (x right, y down, pixel (0,0)
// spans [0,1)); pixel centres are at integer + 0.5.
function pointerToImage(event, which, width, height) {
  const rect = $(`${which}-overlay`).getBoundingClientRect();
  const view = state.view[which];
  return {
    x: ((event.clientX - rect.left - view.tx) / (rect.width * view.zoom)) * width,
    y: ((event.clientY - rect.top - view.ty) / (rect.height * view.zoom)) * height,
    pixelsPerUnit: (rect.width * view.zoom) / width,
  };
}

// ---- zoom and pan ----------------------------------------------------------------------------

// Each panel's view: the image canvas scaled by `zoom` (1: the whole image
// fits) and moved by (tx, ty) CSS pixels, nearest-neighbour (image-rendering:
// pixelated): one image pixel is a block of identical screen pixels. The wheel
// zooms about the pointer; Shift + drag or the middle button pans; a double
// click or the 0 key fits the image again.
const maxZoom = 64;

function applyView(which) {
  const view = state.view[which];
  const stack = $(`${which}-stack`);
  const width = stack.clientWidth;
  const height = stack.clientHeight;
  view.tx = Math.min(0, Math.max(width - width * view.zoom, view.tx));
  view.ty = Math.min(0, Math.max(height - height * view.zoom, view.ty));
  $(`${which}-canvas`).style.transform = view.zoom === 1 ? "" : `translate(${view.tx}px, ${view.ty}px) scale(${view.zoom})`;
  stack.dataset.zoom = String(view.zoom);
  if (which === "realspace") drawRealspaceOverlay();
  else drawDiffractionOverlay();
}

function resetView(which) {
  state.view[which] = { zoom: 1, tx: 0, ty: 0 };
  applyView(which);
}

function wheelZoom(which, event) {
  if (!(which === "realspace" ? state.realspace : state.diffraction)) return;
  event.preventDefault();
  const view = state.view[which];
  const rect = $(`${which}-overlay`).getBoundingClientRect();
  const zoom = Math.min(maxZoom, Math.max(1, view.zoom * Math.exp(-event.deltaY * 0.0015)));
  const mx = event.clientX - rect.left;
  const my = event.clientY - rect.top;
  // The point under the pointer stays under it.
  view.tx = mx - ((mx - view.tx) / view.zoom) * zoom;
  view.ty = my - ((my - view.ty) / view.zoom) * zoom;
  view.zoom = zoom;
  applyView(which);
}

// Shift + left button or the middle button: a pan; returns whether it took the event.
function startPan(which, event) {
  if (!(event.button === 1 || (event.button === 0 && event.shiftKey))) return false;
  const view = state.view[which];
  state.pan = { which, x: event.clientX, y: event.clientY, tx: view.tx, ty: view.ty };
  $(`${which}-overlay`).setPointerCapture(event.pointerId);
  event.preventDefault();
  return true;
}

function movePan(which, event) {
  const pan = state.pan;
  if (!pan || pan.which !== which) return false;
  const view = state.view[which];
  view.tx = pan.tx + event.clientX - pan.x;
  view.ty = pan.ty + event.clientY - pan.y;
  applyView(which);
  return true;
}

function endPan(which) {
  if (!state.pan || state.pan.which !== which) return false;
  state.pan = null;
  return true;
}

function scanPosition(point, image) {
  const col = Math.floor(point.x);
  const row = Math.floor(point.y);
  if (row < 0 || col < 0 || row >= image.height || col >= image.width) return null;
  return { row, col };
}

// `which`'s overlay canvas, cleared, with its 2-D context.
function clearedOverlay(which) {
  const overlay = $(`${which}-overlay`);
  const context = overlay.getContext("2d");
  context.clearRect(0, 0, overlay.width, overlay.height);
  return { overlay, context };
}

// How `which`'s view lays an image of width × height on its overlay: device
// pixels per image pixel (sx, sy: the zoom included), the pan in device
// pixels (tx, ty) and the screen's pixel ratio.
function overlayMapping(which, overlay, width, height) {
  const ratio = window.devicePixelRatio || 1;
  const view = state.view[which];
  return {
    ratio,
    sx: (overlay.width / width) * view.zoom,
    sy: (overlay.height / height) * view.zoom,
    tx: view.tx * ratio,
    ty: view.ty * ratio,
  };
}

function drawRealspaceOverlay() {
  const { overlay, context } = clearedOverlay("realspace");
  if (!state.realspace) return;
  const { width, height } = state.realspace.image;
  const { ratio, sx, sy, tx, ty } = overlayMapping("realspace", overlay, width, height);
  context.setTransform(1, 0, 0, 1, tx, ty);  // markers move with the zoomed image
  context.lineWidth = 1.5 * ratio;
  // Each marker is drawn twice: a dark casing under the coloured line, so it
  // shows on bright and on dark areas alike.
  const drawSource = (source, color, dashed) => {
    if (!source) return;
    context.lineWidth = 3.5 * ratio;
    context.strokeStyle = "rgba(0,0,0,0.85)";
    context.setLineDash([]);
    strokeSource(source);
    context.lineWidth = 1.5 * ratio;
    context.strokeStyle = color;
    context.setLineDash(dashed ? [4 * ratio, 3 * ratio] : []);
    strokeSource(source);
  };
  const strokeSource = (source) => {
    if (source.kind === "position") {
      const size = Math.max(sx, 6 * ratio);
      const cx = (source.col + 0.5) * sx;
      const cy = (source.row + 0.5) * sy;
      context.strokeRect(cx - size / 2, cy - size / 2, size, size);
    } else if (source.kind === "rectangle") {
      context.strokeRect(source.colStart * sx, source.rowStart * sy,
        (source.colStop - source.colStart) * sx, (source.rowStop - source.rowStart) * sy);
    } else if (source.kind === "line") {
      context.beginPath();
      context.moveTo((source.c0 + 0.5) * sx, (source.r0 + 0.5) * sy);
      context.lineTo((source.c1 + 0.5) * sx, (source.r1 + 0.5) * sy);
      context.stroke();
    } else if (source.kind === "circle") {
      context.beginPath();
      context.ellipse((source.col + 0.5) * sx, (source.row + 0.5) * sy, source.radius * sx, source.radius * sy, 0, 0, 2 * Math.PI);
      context.stroke();
    }
  };
  drawSource(state.pinned, "#ff5d5d", false);
  if (state.hover) drawSource(state.hover, "#ffffff", true);
  if (state.line) drawSource(state.line, "#5ccf7f", false);
  if (state.regionPreview) drawSource(state.regionPreview, "#f2b33d", true);
  context.setTransform(1, 0, 0, 1, 0, 0);
  drawUnitsBar("realspace", context, overlay, width);
}

function unitsOf(which) {
  if (!state.current) return null;
  const entry = state.current.entry;
  return which === "realspace" ? realspaceUnits(entry, state.plan) : diffractionUnits(entry, state.plan);
}

// The scale bar of an image `width` pixels wide, drawn on its overlay.
function drawUnitsBar(which, context, overlay, width) {
  state.scaleBars[which] = null;
  const units = unitsOf(which);
  if (!units) return;
  const zoom = state.view[which].zoom;
  const bar = scaleBar(units, width / zoom);  // a quarter of what is in view
  const length = ((bar.pixels * overlay.width) / width) * zoom;
  const placed = drawScaleBar(context, length, bar.label, window.devicePixelRatio || 1);
  state.scaleBars[which] = { ...bar, ...placed, unitSize: units.size, imageWidth: width, overlayWidth: overlay.width,
                             zoom };
}

// Realspace pointer: hover (latest-only diffraction), click, region drags.
function realspacePointerDown(event) {
  if (!state.realspace || startPan("realspace", event) || event.button !== 0) return;
  const image = state.realspace.image;
  const point = pointerToImage(event, "realspace", image.width, image.height);
  const tool = $("tool-select").value;
  $("realspace-overlay").setPointerCapture(event.pointerId);
  state.drag = { tool, start: point, current: point };
  if (tool === "point") {
    const position = scanPosition(point, image);
    if (position) pinDiffraction({ kind: "position", ...position });
  }
}

function regionFromDrag(drag, image) {
  const { start, current } = drag;
  if (drag.tool === "line") {
    // From the centre of the pixel pressed to the centre of the pixel released.
    return { kind: "line", r0: Math.floor(start.y), c0: Math.floor(start.x), r1: Math.floor(current.y),
             c1: Math.floor(current.x) };
  }
  if (drag.tool === "circle") {
    const radius = Math.hypot(current.x - start.x, current.y - start.y);
    return { kind: "circle", row: start.y - 0.5, col: start.x - 0.5, radius: Math.max(0.5, radius) };
  }
  const clampRow = (v) => Math.max(0, Math.min(image.height - 1, Math.floor(v)));
  const clampCol = (v) => Math.max(0, Math.min(image.width - 1, Math.floor(v)));
  const r0 = clampRow(Math.min(start.y, current.y));
  const r1 = clampRow(Math.max(start.y, current.y));
  const c0 = clampCol(Math.min(start.x, current.x));
  const c1 = clampCol(Math.max(start.x, current.x));
  return { kind: "rectangle", rowStart: r0, rowStop: r1 + 1, colStart: c0, colStop: c1 + 1 };
}

function realspacePointerMove(event) {
  if (!state.realspace || movePan("realspace", event)) return;
  const image = state.realspace.image;
  const point = pointerToImage(event, "realspace", image.width, image.height);
  const position = scanPosition(point, image);
  if (position) {
    const index = position.row * image.width + position.col;
    const value = image.data[index] / image.divisor;
    $("realspace-readout").dataset.hover = `${position.row},${position.col}`;
    const units = unitsOf("realspace");
    const where = units ? ` (y ${formatLength(position.row * units.size)}, x ${formatLength(position.col * units.size)})` : "";
    $("realspace-readout").textContent = `row ${position.row}, column ${position.col}${where}: ${formatValue(value)}` +
      ` · server-timing ${formatServerTiming(state.realspace.serverTiming)}`;
  }
  if (state.drag && state.drag.tool !== "point") {
    state.drag.current = point;
    state.regionPreview = regionFromDrag(state.drag, image);
    drawRealspaceOverlay();
    return;
  }
  if (!state.drag && $("follow-pointer").checked && position) {
    if (state.hover && state.hover.row === position.row && state.hover.col === position.col) return;
    state.hover = { kind: "position", ...position };
    drawRealspaceOverlay();
    requestDiffraction(state.hover);
  }
}

function realspacePointerUp(event) {
  if (endPan("realspace")) return;
  const drag = state.drag;
  state.drag = null;
  if (!drag || !state.realspace) return;
  const image = state.realspace.image;
  if (drag.tool === "point") return;
  drag.current = pointerToImage(event, "realspace", image.width, image.height);
  state.regionPreview = null;
  const moved = Math.hypot(drag.current.x - drag.start.x, drag.current.y - drag.start.y) * drag.start.pixelsPerUnit;
  if (moved < 3) {
    // A click with a region tool picks one position.
    const position = scanPosition(drag.current, image);
    if (position) pinDiffraction({ kind: "position", ...position });
    return;
  }
  if (drag.tool === "line") {
    state.line = regionFromDrag(drag, image);
    showLineProfile();
    drawRealspaceOverlay();
    return;
  }
  pinDiffraction({ ...regionFromDrag(drag, image), reduce: $("reduce-select").value });
}

function realspacePointerLeave() {
  if (state.drag) return;
  state.hover = null;
  drawRealspaceOverlay();
  // Back to the pinned pattern when the pointer showed another one.
  if (state.diffraction && !sameSource(state.diffraction.source, state.pinned)) requestDiffraction(state.pinned);
}

function sameSource(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

// ---- diffraction ------------------------------------------------------------------------

function diffractionRequest(source) {
  const image = state.realspace && state.realspace.image;
  if (source.kind === "position") {
    return { route: "/api/browse/cbed", params: { ...planParams(), sx: source.row, sy: source.col, ensure_resident: "true" } };
  }
  if (source.kind === "circle") {
    return {
      route: "/api/browse/cbed-region",
      params: { ...planParams(), shape: "circle", cx: round(source.col, 3), cy: round(source.row, 3),
                radius: round(source.radius, 3), reduce: source.reduce || "mean", ensure_resident: "true" },
    };
  }
  if (source.kind === "rectangle") {
    // The daemon's ROIs are circles and squares around a centre; a rectangle
    // of the displayed grid is sent as a crop of the source scan (aligned
    // with the scan bins, so the same binned positions) and a square that
    // covers all of it.
    const b = state.plan.scan_bin;
    const shape = state.current.entry.shape;
    const crop = state.plan.crop || { row_start: 0, row_stop: shape[0], column_start: 0, column_stop: shape[1] };
    const rect = {
      row_start: crop.row_start + source.rowStart * b,
      row_stop: Math.min(crop.row_start + source.rowStop * b, crop.row_stop),
      column_start: crop.column_start + source.colStart * b,
      column_stop: Math.min(crop.column_start + source.colStop * b, crop.column_stop),
    };
    const rows = source.rowStop - source.rowStart;
    const cols = source.colStop - source.colStart;
    return {
      route: "/api/browse/cbed-region",
      params: { ...planParams({ crop: rect }), shape: "square", cx: (cols - 1) / 2, cy: (rows - 1) / 2,
                radius: Math.max(rows, cols), reduce: source.reduce || "mean", ensure_resident: "true" },
    };
  }
  // The mean of every position: a square covering the whole grid.
  const rows = image ? image.height : 1;
  const cols = image ? image.width : 1;
  return {
    route: "/api/browse/cbed-region",
    params: { ...planParams(), shape: "square", cx: (cols - 1) / 2, cy: (rows - 1) / 2, radius: Math.max(rows, cols),
              reduce: "mean", ensure_resident: "true" },
  };
}

const diffractionChannel = new LatestOnly(
  async ({ source, generation }) => {
    const { route, params } = diffractionRequest(source);
    const result = await api.request(route, params, { kind: "array" });
    return { ...result, route, params, source, generation };
  },
  (result, error, args) => {
    if (args.generation !== state.generation) return;
    if (error) {
      reportError(error, $("diffraction-status"));
      return;
    }
    state.diffraction = { image: result.body, route: result.route, params: result.params, source: result.source,
                          serverTiming: result.serverTiming };
    drawDiffraction();
  },
);

function requestDiffraction(source) {
  if (!state.current || !state.realspace) return;
  diffractionChannel.request({ source, generation: state.generation });
}

function pinDiffraction(source) {
  state.pinned = source;
  state.hover = null;
  drawRealspaceOverlay();
  requestDiffraction(source);
}

function describeSource(source, image) {
  const positions = image.provenance && image.provenance.geometry && image.provenance.geometry.positions;
  switch (source.kind) {
    case "position":
      return `scan row ${source.row}, column ${source.col}`;
    case "circle":
      return `${source.reduce} of ${positions} positions within ${source.radius.toFixed(1)} of (${source.row.toFixed(1)}, ${source.col.toFixed(1)})`;
    case "rectangle":
      return `${source.reduce} of rows ${source.rowStart}–${source.rowStop - 1}, columns ${source.colStart}–${source.colStop - 1} (${positions} positions)`;
    default:
      return `mean of all ${positions} positions`;
  }
}

function drawDiffraction() {
  const started = performance.now();
  const diffraction = state.diffraction;
  if (!diffraction) return;
  const { image, source } = diffraction;
  const settings = displaySettings("diffraction");
  const values = displayValues(image.data, image.divisor, settings.scale === "log");
  let low;
  let highValue;
  if (settings.manual) {
    [low, highValue] = settings.manual;
  } else {
    [low] = finiteRange(values);
    [highValue] = percentiles(values, [settings.high]);
    if (!(highValue > low)) [low, highValue] = finiteRange(values);
  }
  diffraction.limits = [low, highValue];
  const canvas = $("diffraction-canvas");
  const colormap = settings.colormap;
  const table = lookupTable(colormap);
  paint(canvas, values, image.width, image.height, low, highValue, table);
  layoutStack("diffraction", image.width, image.height);
  drawDiffractionOverlay();
  drawHistogram($("diffraction-histogram"), values, low, highValue, colormap);
  drawColorBar($("diffraction-colorbar"), table, low, highValue, settings);
  state.drawMs.diffraction = performance.now() - started;
  state.frames.diffraction++;
  canvas.dataset.frame = String(state.frames.diffraction);
  canvas.dataset.source = JSON.stringify(source);
  $("diffraction-source").textContent = describeSource(source, image);
  $("diffraction-status").textContent = "";
  updateMaskReadout();
}

function maskEditable() {
  return Boolean(modePresets[state.mode]) && Boolean(state.mask);
}

function drawDiffractionOverlay() {
  const { overlay, context } = clearedOverlay("diffraction");
  if (!state.diffraction) return;
  const { width, height } = state.diffraction.image;
  if (!state.mask) {
    drawUnitsBar("diffraction", context, overlay, width);
    return;
  }
  const { ratio, sx, sy, tx, ty } = overlayMapping("diffraction", overlay, width, height);
  const mask = state.mask;
  const cx = (mask.col + 0.5) * sx + tx;
  const cy = (mask.row + 0.5) * sy + ty;
  const active = maskEditable();
  context.setLineDash(active ? [] : [5 * ratio, 4 * ratio]);
  context.lineWidth = 2 * ratio;
  const ring = (radius, color) => {
    context.strokeStyle = color;
    context.beginPath();
    context.ellipse(cx, cy, radius * sx, radius * sy, 0, 0, 2 * Math.PI);
    context.stroke();
  };
  ring(mask.outer, active ? "#4fd1c5" : "rgba(79,209,197,0.45)");
  if (state.mode !== "BF" && mask.inner > 0) ring(mask.inner, active ? "#f2b33d" : "rgba(242,179,61,0.45)");
  context.setLineDash([]);
  context.strokeStyle = active ? "#ffffff" : "rgba(255,255,255,0.5)";
  context.lineWidth = 1.5 * ratio;
  const arm = 6 * ratio;
  context.beginPath();
  context.moveTo(cx - arm, cy);
  context.lineTo(cx + arm, cy);
  context.moveTo(cx, cy - arm);
  context.lineTo(cx, cy + arm);
  context.stroke();
  drawUnitsBar("diffraction", context, overlay, width);
}

function updateMaskReadout() {
  const readout = $("mask-readout");
  const timing = state.diffraction ? formatServerTiming(state.diffraction.serverTiming) : "\u2014";
  if (!state.mask) {
    readout.textContent = `server-timing ${timing}`;
    return;
  }
  const m = state.mask;
  const r = state.fit ? ` (R = ${state.fit.radius.toFixed(2)} px)` : "";
  const usage = comModes.has(state.mode) ? " · not used by centre-of-mass images" : "";
  const inner = state.mode === "BF" ? "" : ` · inner ${m.inner.toFixed(2)} px`;
  readout.textContent = `mask centre row ${m.row.toFixed(2)}, column ${m.col.toFixed(2)}${inner} · outer ${m.outer.toFixed(2)} px${r}` +
    `${usage} · server-timing ${timing}`;
}

// Mask drag: near the outer ring resizes it, near the inner ring resizes that,
// anywhere else inside moves the centre. The real-space image follows while
// dragging (latest-only requests).
function diffractionPointerDown(event) {
  if (!state.diffraction || startPan("diffraction", event) || !maskEditable() || event.button !== 0) return;
  const { width, height } = state.diffraction.image;
  const point = pointerToImage(event, "diffraction", width, height);
  const row = point.y - 0.5;
  const col = point.x - 0.5;
  const mask = state.mask;
  const distance = Math.hypot(row - mask.row, col - mask.col);
  const tolerance = 8 / point.pixelsPerUnit;
  let handle = "centre";
  if (Math.abs(distance - mask.outer) <= tolerance) handle = "outer";
  else if (state.mode !== "BF" && mask.inner > 0 && Math.abs(distance - mask.inner) <= tolerance) handle = "inner";
  else if (distance > mask.outer + tolerance) return;
  $("diffraction-overlay").setPointerCapture(event.pointerId);
  state.maskDrag = { handle, startRow: row, startCol: col, mask: { ...mask } };
  event.preventDefault();
}

function diffractionPointerMove(event) {
  if (!state.diffraction || movePan("diffraction", event)) return;
  const { width, height } = state.diffraction.image;
  const point = pointerToImage(event, "diffraction", width, height);
  showDiffractionHover(point);
  const drag = state.maskDrag;
  if (!drag) {
    const overlay = $("diffraction-overlay");
    if (!maskEditable()) {
      overlay.style.cursor = "default";
      return;
    }
    const distance = Math.hypot(point.y - 0.5 - state.mask.row, point.x - 0.5 - state.mask.col);
    const tolerance = 8 / point.pixelsPerUnit;
    const nearRing = Math.abs(distance - state.mask.outer) <= tolerance ||
      (state.mode !== "BF" && state.mask.inner > 0 && Math.abs(distance - state.mask.inner) <= tolerance);
    overlay.style.cursor = nearRing ? "ew-resize" : distance < state.mask.outer ? "move" : "default";
    return;
  }
  const row = point.y - 0.5;
  const col = point.x - 0.5;
  const mask = { ...drag.mask };
  if (drag.handle === "centre") {
    mask.row = drag.mask.row + (row - drag.startRow);
    mask.col = drag.mask.col + (col - drag.startCol);
  } else {
    const radius = Math.hypot(row - mask.row, col - mask.col);
    if (drag.handle === "outer") mask.outer = Math.max(radius, mask.inner + 0.5, 0.5);
    else mask.inner = Math.max(0, Math.min(radius, mask.outer - 0.5));
  }
  state.mask = mask;
  state.maskCustom = true;
  drawDiffractionOverlay();
  updateMaskReadout();
  requestRealspace();
}

// The detector pixel under the pointer, its value, and its angle from the
// beam centre (the mask's, else the fit's) in mrad when calibrated.
function showDiffractionHover(point) {
  const image = state.diffraction.image;
  const col = Math.floor(point.x);
  const row = Math.floor(point.y);
  const readout = $("diffraction-readout");
  if (row < 0 || col < 0 || row >= image.height || col >= image.width) return;
  const value = image.data[row * image.width + col] / image.divisor;
  let text = `detector row ${row}, column ${col}: ${formatValue(value)}`;
  const centre = state.mask || state.fit;
  const units = unitsOf("diffraction");
  if (centre) {
    const dy = row - centre.row;
    const dx = col - centre.col;
    const radius = Math.hypot(dx, dy);
    text += units
      ? ` · k ${formatAngle(radius * units.size)} from the centre (kx ${formatAngle(dx * units.size)}, ky ${formatAngle(dy * units.size)})`
      : ` · ${radius.toFixed(2)} px from the centre (uncalibrated)`;
    readout.dataset.k = units ? String(radius * units.size) : "";
  }
  readout.dataset.hover = `${row},${col}`;
  readout.textContent = text;
}

function diffractionPointerUp() {
  if (endPan("diffraction") || !state.maskDrag) return;
  state.maskDrag = null;
  requestRealspace();
}

// ---- plan controls ------------------------------------------------------------------------

function readPlanIntoForm() {
  $("scan-bin").value = state.plan.scan_bin;
  $("det-bin").value = state.plan.det_bin;
  const crop = state.plan.crop;
  $("crop-row-start").value = crop ? crop.row_start : "";
  $("crop-row-stop").value = crop ? crop.row_stop : "";
  $("crop-col-start").value = crop ? crop.column_start : "";
  $("crop-col-stop").value = crop ? crop.column_stop : "";
}

// The plan the form shows (the daemon validates; the form only fills the blanks).
function planFromForm() {
  const integer = (id, fallback) => {
    const text = $(id).value.trim();
    return text === "" ? fallback : Number(text);
  };
  const shape = state.current.entry.shape;
  const fields = ["crop-row-start", "crop-row-stop", "crop-col-start", "crop-col-stop"];
  const anyCrop = fields.some((id) => $(id).value.trim() !== "");
  return {
    scan_bin: integer("scan-bin", 1),
    det_bin: integer("det-bin", 1),
    crop: anyCrop
      ? {
          row_start: integer("crop-row-start", 0),
          row_stop: integer("crop-row-stop", shape[0]),
          column_start: integer("crop-col-start", 0),
          column_stop: integer("crop-col-stop", shape[1]),
        }
      : null,
  };
}

function applyPlan(event) {
  if (event) event.preventDefault();
  if (!state.current) return;
  setPlan(planFromForm());
}

function setPlan(plan) {
  state.plan = plan;
  state.generation++;
  resetPlanDependentState();
  clearExportStatus();
  clearCanvas("diffraction");
  requestRealspace();
}

// ---- saving -------------------------------------------------------------------------------

// ---- export ------------------------------------------------------------------------

function showExport(job) {
  const status = $("export-status");
  const progress = $("export-progress");
  status.classList.remove("error-text");
  const running = job.state === "queued" || job.state === "running";
  progress.hidden = !running;
  if (job.frames_total) progress.value = job.frames_done / job.frames_total;
  if (running) {
    status.textContent = `export ${job.id}: ${job.stage} ${job.frames_done}/${job.frames_total} frames`;
  } else if (job.state === "done") {
    const result = job.result || {};
    status.textContent = `exported to ${result.path || job.export_dir + "/" + job.folder} (${formatBytes(result.output_bytes || 0)}, ${(result.seconds ? result.seconds.total : job.elapsed_seconds).toFixed(2)} s)`;
    status.title = result.master_path || "";
  } else {
    status.textContent = `export ${job.state}: ${job.error ? `${job.error.status}: ${job.error.detail}` : ""}`;
    status.title = status.textContent;
    status.classList.add("error-text");
  }
}

// The export status belongs to one acquisition and plan: another one clears it.
function clearExportStatus() {
  state.exportShown = null;
  const status = $("export-status");
  status.textContent = "";
  status.title = "";
  status.classList.remove("error-text");
  $("export-progress").hidden = true;
}

function exportKey() {
  return state.current ? JSON.stringify([state.current.session, state.current.file, state.plan]) : "";
}

// Exports what the form shows: a crop or bin typed but not applied is applied
// first, so the images and the export are of the same plan.
async function exportPlan() {
  if (!state.current) return;
  const formPlan = planFromForm();
  if (JSON.stringify(formPlan) !== JSON.stringify(state.plan)) setPlan(formPlan);
  const key = exportKey();
  clearExportStatus();
  state.exportShown = key;
  const status = $("export-status");
  const shown = () => state.exportShown === key;
  $("export-button").disabled = true;
  try {
    let { body: job } = await api.request("/api/browse/export", planParams(), { method: "POST" });
    state.exportJob = job;
    if (shown()) showExport(job);
    while (job.state === "queued" || job.state === "running") {
      await new Promise((resolve) => setTimeout(resolve, 250));
      ({ body: job } = await api.request(`/api/browse/export/${encodeURIComponent(job.id)}`, {}, { quiet: true }));
      state.exportJob = job;
      if (shown()) showExport(job);
    }
    if (job.state === "done") loadSessions(true);
  } catch (error) {
    if (shown()) {
      $("export-progress").hidden = true;
      status.textContent = "";
      reportError(error, status);
      status.title = status.textContent;
    }
  } finally {
    $("export-button").disabled = false;
  }
}

function download(blob, name) {
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = name;
  document.body.appendChild(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 10000);
}

function baseName(kind) {
  const stem = state.current.file.replace(/_master\.h5$/, "");
  const plan = `s${state.plan.scan_bin}d${state.plan.det_bin}${state.plan.crop ? "-crop" : ""}`;
  return `${stem}_${kind}_${plan}`;
}

function savePng(which) {
  const target = which === "realspace" ? state.realspace : state.diffraction;
  if (!target) return;
  const kind = which === "realspace" ? realspaceKind() : diffractionKind();
  $(`${which}-canvas`).toBlob((blob) => download(blob, `${baseName(kind)}.png`), "image/png");
}

// A figure: the image enlarged by a whole factor (nearest neighbour, so each
// pixel stays one colour), its scale bar when calibrated, a title, and the
// colour bar with its limits below; as PNG. The bare pixels (PNG) and the
// exact values (.npy) stay beside it.
function figureCanvas(which) {
  const target = which === "realspace" ? state.realspace : state.diffraction;
  const source = $(`${which}-canvas`);
  const { width, height } = target.image;
  const factor = Math.max(1, Math.min(16, Math.ceil(512 / Math.max(width, height))));
  const title = `${state.current.file} · ${which === "realspace" ? realspaceKind() : describeSource(target.source, target.image)}` +
    ` · scan bin ${state.plan.scan_bin}, detector bin ${state.plan.det_bin}${state.plan.crop ? ", cropped" : ""}`;
  const margin = 8;
  const titleHeight = 22;
  const barHeight = 16;
  const labelsHeight = 16;
  const figureWidth = Math.max(width * factor, 320) + 2 * margin;
  const canvas = document.createElement("canvas");
  canvas.width = figureWidth;
  canvas.height = titleHeight + height * factor + margin + barHeight + labelsHeight + margin;
  const context = canvas.getContext("2d");
  context.fillStyle = "#ffffff";
  context.fillRect(0, 0, canvas.width, canvas.height);
  context.fillStyle = "#000000";
  context.font = "13px system-ui, sans-serif";
  context.textBaseline = "middle";
  context.fillText(title, margin, titleHeight / 2, figureWidth - 2 * margin);
  const imageLeft = margin;
  const imageTop = titleHeight;
  context.imageSmoothingEnabled = false;
  context.drawImage(source, imageLeft, imageTop, width * factor, height * factor);
  const figure = { factor, imageLeft, imageTop, width: canvas.width, height: canvas.height, bar: null };
  const units = unitsOf(which);
  if (units) {
    const bar = scaleBar(units, width);
    context.save();
    context.translate(imageLeft, imageTop + height * factor - context.canvas.height);
    // drawScaleBar places the bar at the bottom left of the canvas it is given: shift it onto the image.
    const placed = drawScaleBar(context, bar.pixels * factor, bar.label, 1);
    context.restore();
    figure.bar = { label: bar.label, x0: placed.x0 + imageLeft, x1: placed.x1 + imageLeft,
                   y: placed.y + imageTop + height * factor - canvas.height, thickness: placed.thickness };
  }
  const settings = displaySettings(which === "realspace" ? realspaceKind() : "diffraction");
  const table = which === "realspace" ? tableFor(settings.colormap, settings.scale, settings.gamma) : lookupTable(settings.colormap);
  const barTop = imageTop + height * factor + margin;
  const barWidth = figureWidth - 2 * margin;
  for (let x = 0; x < barWidth; x++) {
    const level = Math.min(255, Math.floor((x / Math.max(1, barWidth - 1)) * 255)) * 4;
    context.fillStyle = `rgb(${table[level]},${table[level + 1]},${table[level + 2]})`;
    context.fillRect(margin + x, barTop, 1, barHeight);
  }
  const [low, high] = target.limits;
  context.fillStyle = "#000000";
  context.font = "11px system-ui, sans-serif";
  context.textBaseline = "top";
  const scaleText = settings.scale === "log" ? "log10(1 + v) " : settings.scale === "gamma" ? `gamma ${settings.gamma}, ` : "";
  context.fillText(`${scaleText}${formatValue(low)}`, margin, barTop + barHeight + 2);
  const highText = formatValue(high);
  context.fillText(highText, margin + barWidth - context.measureText(highText).width, barTop + barHeight + 2);
  figure.colorbar = { x0: margin, x1: margin + barWidth, y: barTop, height: barHeight };
  return { canvas, figure };
}

function saveFigure(which) {
  const target = which === "realspace" ? state.realspace : state.diffraction;
  if (!target) return;
  const kind = which === "realspace" ? realspaceKind() : diffractionKind();
  const { canvas, figure } = figureCanvas(which);
  state.lastFigure = figure;
  canvas.toBlob((blob) => download(blob, `${baseName(kind)}_figure.png`), "image/png");
}

// The .npy comes from the daemon (format=npy): the exact values, byte-identical to numpy.save.
async function saveNpy(which) {
  const target = which === "realspace" ? state.realspace : state.diffraction;
  if (!target) return;
  const kind = which === "realspace" ? realspaceKind() : diffractionKind();
  try {
    const { body } = await api.request(target.route, { ...target.params, format: "npy" }, { kind: "blob" });
    const divisor = target.image.divisor;
    download(body, `${baseName(kind)}${divisor > 1 ? `_sum-of-${divisor}` : ""}.npy`);
  } catch (error) {
    reportError(error);
  }
}

function realspaceKind() {
  return state.realspace.route.endsWith("realspace-shape") ? "annulus" : state.realspace.params.mode;
}

function diffractionKind() {
  const source = state.diffraction.source;
  if (source.kind === "position") return `cbed-r${source.row}c${source.col}`;
  return `${source.kind}-${source.reduce || "mean"}`;
}

// ---- wiring ---------------------------------------------------------------------------------

function fillColormaps() {
  for (const [id, initial] of [["realspace-colormap", "gray"], ["diffraction-colormap", "inferno"]]) {
    const select = $(id);
    for (const name of colormapNames) {
      const option = document.createElement("option");
      option.value = name;
      option.textContent = name;
      select.appendChild(option);
    }
    select.value = initial;
  }
}

function modeChanged() {
  const mode = $("mode-select").value;
  state.mode = mode;
  // A new mode starts from its own radii around the current centre.
  if (modePresets[mode] && state.fit) {
    const preset = modePresets[mode];
    const centre = state.mask || { row: state.fit.row, col: state.fit.col };
    state.mask = { row: centre.row, col: centre.col, inner: preset.inner * state.fit.radius,
                   outer: preset.outer * state.fit.radius };
  }
  settingsToForm();
  drawDiffractionOverlay();
  updateMaskReadout();
  markActiveProduct();
  requestRealspace();
}

function wire() {
  fillColormaps();
  $("refresh-button").addEventListener("click", () => loadSessions(true));
  const filterChanged = () => {
    catalogWorker.call("setFilter", { text: $("catalog-search").value, resident: $("catalog-resident").checked })
      .then(acceptCatalog, () => {});
  };
  $("catalog-search").addEventListener("input", filterChanged);
  $("catalog-resident").addEventListener("change", filterChanged);
  $("mode-select").addEventListener("change", modeChanged);
  $("plan-form").addEventListener("submit", applyPlan);
  $("plan-reset").addEventListener("click", (event) => {
    event.preventDefault();
    if (!state.current) return;
    state.plan = { scan_bin: 1, det_bin: 1, crop: null };
    readPlanIntoForm();
    setPlan(planFromForm());
  });
  wireDisplayControls();
  $("save-png").addEventListener("click", () => savePng("realspace"));
  $("save-figure").addEventListener("click", () => saveFigure("realspace"));
  $("save-diffraction-figure").addEventListener("click", () => saveFigure("diffraction"));
  $("save-npy").addEventListener("click", () => saveNpy("realspace"));
  $("save-diffraction-png").addEventListener("click", () => savePng("diffraction"));
  $("save-diffraction-npy").addEventListener("click", () => saveNpy("diffraction"));
  $("show-mean").addEventListener("click", () => pinDiffraction({ kind: "mean" }));
  $("show-radial").addEventListener("click", showRadialProfile);
  $("metadata-panel").addEventListener("toggle", showMetadata);
  $("save-profile-csv").addEventListener("click", saveProfileCsv);
  $("profile-close").addEventListener("click", () => {
    state.profile = null;
    state.line = null;
    $("profile-panel").hidden = true;
    drawRealspaceOverlay();
  });
  $("load-button").addEventListener("click", () => state.current && loadAndShow());
  $("export-button").addEventListener("click", exportPlan);
  $("evict-button").addEventListener("click", async () => {
    if (!state.current) return;
    try {
      await api.request("/api/browse/resident", { session: state.current.session, file: state.current.file },
        { method: "DELETE" });
      await fetchResidency(state.current.session, state.current.file);
    } catch (error) {
      reportError(error);
    }
  });
  wirePointers();
  document.addEventListener("keydown", keyPressed);
  window.addEventListener("resize", () => {
    if (state.realspace) layoutStack("realspace", state.realspace.image.width, state.realspace.image.height);
    if (state.diffraction) layoutStack("diffraction", state.diffraction.image.width, state.diffraction.image.height);
    drawRealspaceOverlay();
    drawDiffractionOverlay();
  });
}

// Contrast controls and the histograms of both panels.
function wireDisplayControls() {
  for (const id of ["realspace-low", "realspace-high", "realspace-colormap", "realspace-scale", "realspace-gamma"]) {
    $(id).addEventListener("input", formToSettings);
  }
  $("realspace-auto").addEventListener("click", () => {
    displaySettings(realspaceDisplayKey()).manual = null;
    drawRealspace();
  });
  for (const id of ["diffraction-log", "diffraction-high", "diffraction-colormap"]) {
    $(id).addEventListener("input", diffractionFormToSettings);
  }
  $("diffraction-auto").addEventListener("click", () => {
    displaySettings("diffraction").manual = null;
    drawDiffraction();
  });
  histogramPointer("realspace");
  histogramPointer("diffraction");
}

// Pointer input on both images: tools, mask, zoom and pan.
function wirePointers() {
  const realspaceOverlay = $("realspace-overlay");
  realspaceOverlay.addEventListener("pointerdown", realspacePointerDown);
  realspaceOverlay.addEventListener("pointermove", realspacePointerMove);
  realspaceOverlay.addEventListener("pointerup", realspacePointerUp);
  realspaceOverlay.addEventListener("pointerleave", realspacePointerLeave);
  for (const which of ["realspace", "diffraction"]) {
    const overlay = $(`${which}-overlay`);
    overlay.addEventListener("wheel", (event) => wheelZoom(which, event), { passive: false });
    overlay.addEventListener("dblclick", () => resetView(which));
    overlay.addEventListener("auxclick", (event) => event.preventDefault());
  }
  const diffractionOverlay = $("diffraction-overlay");
  diffractionOverlay.addEventListener("pointerdown", diffractionPointerDown);
  diffractionOverlay.addEventListener("pointermove", diffractionPointerMove);
  diffractionOverlay.addEventListener("pointerup", diffractionPointerUp);
  diffractionOverlay.addEventListener("pointercancel", diffractionPointerUp);
}

// ---- metadata ---------------------------------------------------------------------------

// What the page knows of the open acquisition: its catalog entry, its
// residency and the provenance of the last real-space image.
function showMetadata() {
  if (!state.current) return;
  const { session, file, entry } = state.current;
  const rows = [];
  const add = (name, value) => {
    if (value === undefined || value === null || value === "") return;
    rows.push([name, typeof value === "object" ? JSON.stringify(value) : String(value)]);
  };
  add("path", `${session}/${file}`);
  if (entry) {
    const [sr, sc, dr, dc] = entry.shape || [];
    add("scan", `${sr} × ${sc} positions`);
    add("detector", `${dr} × ${dc} pixels, ${entry.dtype || "?"}`);
    add("size", `${entry.size} (${entry.size_bytes} bytes)`);
    add("scan_sampling_A", entry.scan_sampling_A > 0 ? `${entry.scan_sampling_A} Å (${formatLength(entry.scan_sampling_A)})`
      : "not in the master");
    add("k_pixel_size_mrad", entry.k_pixel_size_mrad > 0 ? `${entry.k_pixel_size_mrad} mrad` : "not in the master");
    add("readiness", entry.load_status ? [entry.load_status.reason, entry.load_status.action].filter(Boolean).join(" — ") : "");
  }
  const doc = state.residency.get(residencyKey(session, file));
  if (doc) {
    add("residency", doc.state + (doc.device !== null && doc.device !== undefined ? ` on device ${doc.device}` : ""));
    add("resident bytes", doc.resident_bytes);
    add("encoding", doc.encoding);
    add("tile sums", doc.tile_sums && doc.tile_sums.state);
  }
  const provenance = state.realspace && state.realspace.image.provenance;
  if (provenance) {
    add("source signature", provenance.signature);
    add("masked pixels", provenance.masked_pixel_count);
    const fit = provenance.geometry && provenance.geometry.bright_field;
    if (fit) {
      add("bright-field fit", `centre row ${fit.center_row.toFixed(2)}, column ${fit.center_col.toFixed(2)}, ` +
        `radius ${fit.radius.toFixed(2)} px (detector bin ${provenance.detector_bin})`);
    }
    add("backend", `${provenance.backend}, device ${provenance.device_index}`);
    add("implementation", provenance.implementation_revision);
  }
  const list = $("metadata-list");
  list.replaceChildren();
  for (const [name, value] of rows) {
    const term = document.createElement("dt");
    term.textContent = name;
    const description = document.createElement("dd");
    description.textContent = value;
    list.append(term, description);
  }
  showInstrumentMetadata();
}

// What the master and its sidecar say about the instrument, read by the
// daemon when the panel is open (GET /api/browse/metadata), once per opening
// of an acquisition.
function showInstrumentMetadata() {
  if (!state.current || !$("metadata-panel").open) return;
  const { session, file } = state.current;
  const key = residencyKey(session, file);
  const known = state.metadata;
  if (known && known.key === key) {
    if (!known.pending) renderInstrumentMetadata(known);
    return;
  }
  const record = { key, pending: true, doc: null, error: null };
  state.metadata = record;
  $("metadata-status").textContent = "Reading the master's metadata…";
  $("metadata-instrument").replaceChildren();
  $("metadata-entries").tBodies[0].replaceChildren();
  api.request("/api/browse/metadata", { session, file }).then(
    ({ body }) => { record.doc = body; },
    (error) => { record.error = error instanceof ApiError ? error.message : String(error); },
  ).finally(() => {
    record.pending = false;
    if (state.metadata === record) renderInstrumentMetadata(record);
  });
}

function metadataValueText(item) {
  const text = formatQuantity(item.value, item.unit);
  return item.truncated ? `${text}…` : text;
}

function renderInstrumentMetadata(record) {
  const list = $("metadata-instrument");
  const rows = $("metadata-entries").tBodies[0];
  list.replaceChildren();
  rows.replaceChildren();
  const status = $("metadata-status");
  if (record.error) {
    status.textContent = `Not available: ${record.error}`;
    $("metadata-entries-summary").textContent = "Every attribute";
    return;
  }
  const doc = record.doc;
  const fields = Object.entries(doc.fields || {});
  const from = doc.sidecar ? `${state.current.file} and ${doc.sidecar}` : state.current.file;
  status.textContent = fields.length ? `From ${from}; hover a value for where it was read.`
    : `${from} holds none of the well-known instrument fields.`;
  for (const [name, field] of fields) {
    const term = document.createElement("dt");
    term.textContent = field.label || name;
    const description = document.createElement("dd");
    description.textContent = metadataValueText(field);
    description.dataset.field = name;
    description.dataset.value = String(field.value);
    description.dataset.unit = field.unit || "";
    description.title = `${field.source}: ${field.value}${field.unit ? ` ${field.unit}` : ""}`;
    list.append(term, description);
  }
  for (const entry of doc.entries || []) {
    const row = rows.insertRow();
    row.insertCell().textContent = `${entry.file}:${entry.path}`;
    const value = row.insertCell();
    value.textContent = `${entry.value}${entry.truncated ? "…" : ""}${entry.unit ? ` ${entry.unit}` : ""}`;
  }
  $("metadata-entries-summary").textContent =
    `Every attribute (${(doc.entries || []).length}${doc.entries_truncated ? ", cut at the daemon's limits" : ""})`;
}

// ---- profiles ---------------------------------------------------------------------------

// The profile of the line drawn on the real-space image, in nm when calibrated.
function showLineProfile() {
  const image = state.realspace.image;
  const profile = lineProfile(image, state.line);
  const units = unitsOf("realspace");
  const scale = units ? units.size / 10 : 1;  // nm per pixel
  const x = profile.x.map((v) => v * scale);
  const line = state.line;
  const from = `(${line.r0}, ${line.c0})`;
  const to = `(${line.r1}, ${line.c1})`;
  showProfile({ kind: "line", x, y: profile.y, xName: units ? "distance_nm" : "distance_px",
                xLabel: units ? "nm" : "px", name: `line-profile-${realspaceKind()}`,
                description: `${realspaceKind()} along the line from row, column ${from} to ${to}: ` +
                  `${x.length} samples, one a pixel, each the pixel's exact value` });
}

// The radial average of the diffraction pattern about the mask's centre (else the fit's), in mrad when calibrated.
function showRadialProfile() {
  if (!state.diffraction) return;
  const centre = state.mask || state.fit;
  if (!centre) return;
  const profile = radialProfile(state.diffraction.image, centre);
  const units = unitsOf("diffraction");
  const x = profile.x.map((v) => v * (units ? units.size : 1));
  showProfile({ kind: "radial", x, y: profile.y, xName: units ? "k_mrad" : "radius_px", xLabel: units ? "mrad" : "px",
                name: `radial-${diffractionKind()}`, centre: { row: centre.row, col: centre.col },
                description: `radial average of the ${describeSource(state.diffraction.source, state.diffraction.image)}` +
                  ` pattern about row ${centre.row.toFixed(2)}, column ${centre.col.toFixed(2)}; one bin per pixel of radius` });
}

function showProfile(profile) {
  state.profile = profile;
  $("profile-panel").hidden = false;
  $("profile-description").textContent = profile.description;
  plotProfile($("profile-plot"), profile.x, profile.y, profile.xLabel, formatValue);
  state.frames.profile = (state.frames.profile || 0) + 1;
  $("profile-plot").dataset.frame = String(state.frames.profile);
}

function saveProfileCsv() {
  const profile = state.profile;
  if (!profile) return;
  const text = profileCsv(profile, profile.xName, "value", profile.description);
  download(new Blob([text], { type: "text/csv" }), `${baseName(profile.name)}.csv`);
}

// ---- keyboard ---------------------------------------------------------------------------

// Arrow keys step the pinned probe position (Shift: 10 positions); [ and ]
// the previous and next product; j and k the next and previous acquisition
// of the list (as filtered). Keys typed into a field are the field's.
function keyPressed(event) {
  const target = event.target;
  if (event.ctrlKey || event.metaKey || event.altKey) return;
  if (target && (target.isContentEditable || /^(INPUT|SELECT|TEXTAREA)$/.test(target.tagName))) return;
  const steps = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
  if (steps[event.key] && state.realspace) {
    const image = state.realspace.image;
    const [dr, dc] = steps[event.key];
    const size = event.shiftKey ? 10 : 1;
    const from = state.pinned.kind === "position" ? state.pinned
      : { row: Math.floor(image.height / 2), col: Math.floor(image.width / 2) };
    const row = Math.max(0, Math.min(image.height - 1, from.row + dr * size));
    const col = Math.max(0, Math.min(image.width - 1, from.col + dc * size));
    pinDiffraction({ kind: "position", row, col });
    event.preventDefault();
  } else if ((event.key === "]" || event.key === "[") && state.current) {
    const select = $("mode-select");
    const modes = [...select.options].map((option) => option.value);
    const next = modes.indexOf(select.value) + (event.key === "]" ? 1 : -1);
    select.value = modes[(next + modes.length) % modes.length];
    modeChanged();
    event.preventDefault();
  } else if (event.key === "0") {
    resetView("realspace");
    resetView("diffraction");
  } else if (event.key === "j" || event.key === "k") {
    stepAcquisition(event.key === "j" ? 1 : -1);
    event.preventDefault();
  }
}

async function stepAcquisition(step) {
  const from = state.current || { session: "", file: "" };
  const found = await catalogWorker.call("neighbour", { session: from.session, file: from.file, step });
  if (!found || (state.current && found.row.session === from.session && found.row.file.name === from.file)) return;
  catalogView.reveal(found.index);
  openAcquisition(found.row.session, found.row.file.name, found.row.file);
}

// Runs the drawing path once on small images of both element types, so the
// first real answer is drawn by already-optimised code.
function warmUp() {
  const canvas = document.createElement("canvas");
  canvas.width = 64;
  canvas.height = 64;
  const image = canvas.getContext("2d").createImageData(64, 64);
  for (const values of [new Uint32Array(4096), new Float32Array(4096)]) {
    for (let i = 0; i < values.length; i++) values[i] = (i * 7919) % 1000;
    for (let round = 0; round < 20; round++) {
      const [low, high] = percentiles(values, [0.5, 99.5]);
      renderInto(image, values, low, high, lookupTable("gray"));
      histogram(values, 64, low, high);
      finiteRange(values);
    }
  }
}

async function start() {
  catalogView = new CatalogView($("acquisition-list"), catalogWorker, renderCatalogRow);
  catalogView.onDraw = residencyOfNewRows;
  wire();
  warmUp();
  if (state.token) $("auth-info").textContent = "token: from the page address";
  await catalogWorker.call("init", { token: state.token });
  await loadCapabilities();
  if (state.stopped) return;
  await loadSessions(false);
  await pollAcquisitions();
  setInterval(pollAcquisitions, 5000);
  setInterval(() => {
    if (!document.hidden) pollResidency();
  }, 3000);
  pollResidency();
}

// For the browser test and for curious users in the console.
window.quantemViewer = { state, realspaceChannel, diffractionChannel, percentiles, renderInto, lookupTable,
                         pollAcquisitions, loadSessions, connection, get catalogView() { return catalogView; } };

start();
