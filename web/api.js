// The daemon's HTTP API as the viewer uses it (docs/protocol.md).
// Every URL is origin-relative ("/api/browse/..."), so the viewer works through any forward
// (ssh -L, a Unix-socket forward) under whatever host and port the browser
// sees. In token mode the token comes from the page's URL fragment
// (#token=...), which browsers never send to a server, and goes out only as
// `Authorization: Bearer`, never in a query string.

export class ApiError extends Error {
  constructor(status, detail, path) {
    super(typeof detail === "string" ? detail : JSON.stringify(detail));
    this.status = status;
    this.detail = detail;
    this.path = path;
  }
}

// "name;dur=1.23;desc=..., other;dur=4" -> [{name, dur, desc}]
export function parseServerTiming(header) {
  if (!header) return [];
  return header.split(",").map((metric) => {
    const [name, ...params] = metric.split(";").map((part) => part.trim());
    const entry = { name, dur: null, desc: null };
    for (const param of params) {
      const eq = param.indexOf("=");
      if (eq < 0) continue;
      const key = param.slice(0, eq).trim();
      let value = param.slice(eq + 1).trim();
      if (value.startsWith('"') && value.endsWith('"')) value = value.slice(1, -1);
      if (key === "dur") entry.dur = Number(value);
      if (key === "desc") entry.desc = value;
    }
    return entry;
  }).filter((entry) => entry.name);
}

export function formatServerTiming(header) {
  const metrics = parseServerTiming(header);
  if (!metrics.length) return "\u2014";
  return metrics
    .map((m) => {
      if (m.dur !== null && !Number.isNaN(m.dur)) return `${m.name} ${m.dur.toFixed(m.dur < 10 ? 2 : 1)} ms`;
      return m.desc ? `${m.name} ${m.desc}` : m.name;
    })
    .join(", ");
}

const littleEndian = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

// An array response (raw `<u4` or `<f4`, row-major) -> typed array + shape.
export function decodeArray(buffer, headers) {
  const width = Number(headers.get("x-width"));
  const height = Number(headers.get("x-height"));
  const dtype = headers.get("x-dtype");
  const divisor = Number(headers.get("x-value-divisor") || "1") || 1;
  if (!Number.isInteger(width) || !Number.isInteger(height) || width * height * 4 !== buffer.byteLength) {
    throw new ApiError(0, `malformed array response: ${width}x${height} ${dtype}, ${buffer.byteLength} bytes`, "");
  }
  let data;
  if (dtype === "<u4" || dtype === "<f4") {
    const Type = dtype === "<u4" ? Uint32Array : Float32Array;
    if (littleEndian) {
      data = new Type(buffer);
    } else {
      const view = new DataView(buffer);
      data = new Type(width * height);
      for (let i = 0; i < data.length; i++) {
        data[i] = dtype === "<u4" ? view.getUint32(i * 4, true) : view.getFloat32(i * 4, true);
      }
    }
  } else {
    throw new ApiError(0, `unsupported x-dtype ${dtype}`, "");
  }
  let provenance = null;
  const provenanceText = headers.get("x-quantem-provenance");
  if (provenanceText) {
    try {
      provenance = JSON.parse(provenanceText);
    } catch (error) {
      provenance = null;
    }
  }
  return { width, height, dtype, divisor, data, provenance };
}

// The products route's raw bundle (docs/protocol.md, 'Products of one plan
// in one request'): the images back to back, each located by the
// x-quantem-images index -> {images: [{mode, width, height, dtype, divisor, data}], provenance}.
export function decodeBundle(buffer, headers) {
  const index = JSON.parse(headers.get("x-quantem-images"));
  const images = index.map((image) => {
    const [height, width] = image.shape;
    const imageHeaders = new Map([["x-width", String(width)], ["x-height", String(height)], ["x-dtype", image.dtype],
                                  ["x-value-divisor", String(image.value_divisor)]]);
    const bytes = buffer.slice(image.offset, image.offset + image.bytes);
    return { mode: image.mode, ...decodeArray(bytes, imageHeaders) };
  });
  let provenance = null;
  try {
    provenance = JSON.parse(headers.get("x-quantem-provenance"));
  } catch (error) {
    provenance = null;
  }
  return { images, provenance };
}

export class Api {
  // onRequest({method, path, query, status, clientMs, serverTiming, bytes}) is
  // called after every request (the viewer's request log).
  constructor(token, onRequest) {
    this.token = token || null;
    this.onRequest = onRequest || (() => {});
  }

  url(path, params) {
    const query = new URLSearchParams();
    for (const [key, value] of Object.entries(params || {})) {
      if (value !== undefined && value !== null && value !== "") query.set(key, String(value));
    }
    const text = query.toString();
    return text ? `${path}?${text}` : path;
  }

  // kind: "json" | "array" | "bundle" | "blob"; quiet: a background poll (recorded, not
  // shown in the request table); headers: extra request headers (If-None-Match);
  // notModified: a 304 is an answer (body null), not an error. The browser's
  // cache is not used (no-store): revalidation is explicit, so the page knows
  // when nothing changed. Throws ApiError for other non-2xx answers.
  async request(path, params, { method = "GET", kind = "json", signal, quiet = false, headers: extra = {},
                                notModified = false } = {}) {
    const url = this.url(path, params);
    const headers = { ...extra };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    const started = performance.now();
    let response;
    try {
      response = await fetch(url, { method, headers, signal, cache: "no-store", credentials: "omit" });
    } catch (error) {
      if (error.name === "AbortError") throw error;
      this.onRequest({ method, path, query: url, status: 0, clientMs: performance.now() - started, serverTiming: null, bytes: 0, quiet });
      throw new ApiError(0, `the daemon did not answer (${error.message}); is it still running?`, path);
    }
    const serverTiming = response.headers.get("server-timing");
    let body;
    let bytes = 0;
    try {
      if (notModified && response.status === 304) {
        return { body: null, status: 304, headers: response.headers, serverTiming, url };
      }
      if (!response.ok) {
        const text = await response.text();
        bytes = text.length;
        let detail = text;
        try {
          detail = JSON.parse(text).detail ?? text;
        } catch (error) {
          // plain text body (500)
        }
        throw new ApiError(response.status, detail, path);
      }
      if (kind === "json") {
        const buffer = await response.arrayBuffer();
        bytes = buffer.byteLength;  // the body's bytes (after any content-encoding)
        body = JSON.parse(new TextDecoder().decode(buffer));
      } else if (kind === "bundle") {
        const buffer = await response.arrayBuffer();
        bytes = buffer.byteLength;
        body = decodeBundle(buffer, response.headers);
      } else if (kind === "array") {
        const buffer = await response.arrayBuffer();
        bytes = buffer.byteLength;
        body = decodeArray(buffer, response.headers);
      } else {
        body = await response.blob();
        bytes = body.size;
      }
    } finally {
      this.onRequest({ method, path, query: url, status: response.status, clientMs: performance.now() - started, serverTiming, bytes, quiet });
    }
    return { body, status: response.status, headers: response.headers, serverTiming, url };
  }
}

// At most one request of a kind in flight, and at most one waiting: a newer
// call replaces the waiting one, so a moving pointer never builds a queue of
// stale requests. `run(args)` does the work and returns a promise; `deliver`
// gets each finished result (or error) in order.
export class LatestOnly {
  constructor(run, deliver) {
    this.run = run;
    this.deliver = deliver;
    this.inFlight = false;
    this.waiting = null;
    this.issued = 0;
    this.superseded = 0;
  }

  request(args) {
    if (this.inFlight) {
      if (this.waiting) this.superseded++;
      this.waiting = { args };
      return;
    }
    this.start(args);
  }

  async start(args) {
    this.inFlight = true;
    this.issued++;
    let result = null;
    let error = null;
    try {
      result = await this.run(args);
    } catch (caught) {
      error = caught;
    }
    this.inFlight = false;
    // A newer request is waiting: this result is already stale for the pointer,
    // but it is still the freshest picture we have, so deliver it, then go on.
    this.deliver(result, error, args, Boolean(this.waiting));
    if (this.waiting) {
      const next = this.waiting;
      this.waiting = null;
      this.start(next.args);
    }
  }
}
