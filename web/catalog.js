// The acquisition list as a virtualised view: the catalog lives in a worker
// (catalog-worker.js); the page keeps only the row offsets and builds the DOM
// of the rows in view (plus a few above and below), so a list of 20,000
// acquisitions costs what a list of 30 does. Residency badges are found by
// key in a map of the rendered rows: updating one is O(1), not a scan.

const overscan = 8;  // rows rendered beyond each edge of the view

export const rowKey = (session, file) => `${session}\n${file}`;

export class CatalogWorker {
  // onLog(record): every request the worker makes (the page's request log).
  constructor(onLog) {
    this.worker = new Worker("/viewer/catalog-worker.js", { type: "module" });
    this.pending = new Map();
    this.nextId = 1;
    this.worker.onmessage = (event) => {
      const message = event.data;
      if (message.log) {
        onLog(message.log);
        return;
      }
      const waiter = this.pending.get(message.id);
      if (!waiter) return;
      this.pending.delete(message.id);
      if (message.error) waiter.reject(message.error);
      else waiter.resolve(message.result);
    };
  }

  // Resolves with the call's result; rejects with {status, detail, path}.
  call(name, args) {
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.worker.postMessage({ id, call: name, args });
    });
  }
}

export class CatalogView {
  // container: the scrolling element; renderRow(row) -> Element; the rows the
  // worker hands back are {kind: "session", path} or {kind: "file", session, file}.
  constructor(container, worker, renderRow) {
    this.container = container;
    this.worker = worker;
    this.renderRow = renderRow;
    this.notes = document.createElement("div");
    this.notes.className = "catalog-notes";
    this.spacer = document.createElement("div");
    this.spacer.className = "catalog-spacer";
    this.offsets = new Float64Array(1);
    this.version = -1;
    this.cache = new Map();  // row index -> row, for this version
    this.rendered = new Map();  // key ("session\nfile") -> the rendered element
    this.window = [0, 0];
    this.frame = 0;
    this.renders = 0;
    container.replaceChildren(this.notes, this.spacer);
    container.addEventListener("scroll", () => this.schedule(), { passive: true });
    new ResizeObserver(() => this.schedule()).observe(container);
  }

  setNotes(elements) {
    this.notes.replaceChildren(...elements);
  }

  // A new row set (from a worker summary carrying its offsets).
  setRows(summary) {
    this.version = summary.version;
    this.offsets = summary.offsets;
    this.cache.clear();
    this.spacer.style.height = `${this.offsets[this.offsets.length - 1]}px`;
    this.window = [0, 0];
    this.schedule(true);
  }

  get rowCount() {
    return this.offsets.length - 1;
  }

  // One render per animation frame, however many scroll events came.
  schedule(force = false) {
    if (force) this.forced = true;
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.update();
    });
  }

  // The first row whose bottom lies below `y` (binary search on the offsets).
  rowAt(y) {
    let low = 0;
    let high = this.rowCount;
    while (low < high) {
      const middle = (low + high) >> 1;
      if (this.offsets[middle + 1] <= y) low = middle + 1;
      else high = middle;
    }
    return low;
  }

  async update() {
    const top = this.container.scrollTop - this.spacer.offsetTop;
    const start = Math.max(0, this.rowAt(top) - overscan);
    const stop = Math.min(this.rowCount, this.rowAt(top + this.container.clientHeight) + 1 + overscan);
    if (!this.forced && start === this.window[0] && stop === this.window[1]) return;
    this.forced = false;
    this.window = [start, stop];
    const version = this.version;
    let missing = false;
    for (let i = start; i < stop && !missing; i++) missing = !this.cache.has(i);
    if (missing) {
      const answer = await this.worker.call("rows", { start, stop, version });
      if (answer.stale || version !== this.version) return;  // a newer row set is on its way
      answer.rows.forEach((row, i) => this.cache.set(answer.start + i, row));
      if (this.cache.size > 4000) this.trimCache(start, stop);
    }
    if (this.window[0] !== start || this.window[1] !== stop || version !== this.version) return;
    this.draw(start, stop);
  }

  trimCache(start, stop) {
    for (const index of this.cache.keys()) if (index < start - 500 || index > stop + 500) this.cache.delete(index);
  }

  draw(start, stop) {
    const started = performance.now();
    const elements = [];
    this.rendered.clear();
    for (let i = start; i < stop; i++) {
      const row = this.cache.get(i);
      if (!row) continue;
      const element = this.renderRow(row);
      element.style.top = `${this.offsets[i]}px`;
      element.dataset.row = String(i);
      if (row.kind === "file") this.rendered.set(rowKey(row.session, row.file.name), element);
      elements.push(element);
    }
    this.spacer.replaceChildren(...elements);
    this.drawMs = performance.now() - started;
    this.renders++;
    this.container.dataset.renders = String(this.renders);
    if (this.onDraw) this.onDraw();
  }

  element(session, file) {
    return this.rendered.get(rowKey(session, file)) || null;
  }

  // Scrolls row `index` into view (keyboard steps, a revealed acquisition).
  reveal(index) {
    if (index < 0 || index >= this.rowCount) return;
    const top = this.offsets[index] + this.spacer.offsetTop;
    const bottom = this.offsets[index + 1] + this.spacer.offsetTop;
    if (top < this.container.scrollTop) this.container.scrollTop = top;
    else if (bottom > this.container.scrollTop + this.container.clientHeight) {
      this.container.scrollTop = bottom - this.container.clientHeight;
    }
    this.schedule(true);
  }

  // The keys of the file rows in view (their residency is polled).
  visibleKeys() {
    return [...this.rendered.keys()];
  }
}
