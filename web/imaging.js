// Display arithmetic on typed arrays: percentiles, histograms and the mapping
// of values to colours in an ImageData. Nothing here touches the network or
// the DOM beyond the canvas it is given.

// Values to display: value / divisor (the mean of cbed-region), optionally
// log-scaled as log10(1 + v). NaN and infinities are dropped by the
// statistics below and drawn as the lowest colour.
export function displayValues(data, divisor = 1, logScale = false) {
  const out = new Float32Array(data.length);
  const scale = 1 / (divisor || 1);
  if (logScale) {
    for (let i = 0; i < data.length; i++) out[i] = Math.log10(1 + Math.max(0, data[i] * scale));
  } else {
    for (let i = 0; i < data.length; i++) out[i] = data[i] * scale;
  }
  return out;
}

// The finite values, copied (the selection below reorders them) in the
// input's own element type: integer images are copied whole (memcpy speed),
// float images without their NaNs and infinities.
function finiteCopy(values) {
  if (values instanceof Uint32Array || values instanceof Uint16Array || values instanceof Uint8Array ||
      values instanceof Int32Array) {
    return values.slice();
  }
  const copy = new (values instanceof Float32Array ? Float32Array : Float64Array)(values.length);
  let count = 0;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (Number.isFinite(v)) copy[count++] = v;
  }
  return copy.subarray(0, count);
}

// Rearranges a so that a[k] is the k-th smallest (Hoare's selection with
// median-of-three pivots): O(n) on average, in place.
function select(a, k, left = 0, right = a.length - 1) {
  while (right > left) {
    const middle = (left + right) >> 1;
    // Median of three to the middle.
    if (a[middle] < a[left]) [a[middle], a[left]] = [a[left], a[middle]];
    if (a[right] < a[left]) [a[right], a[left]] = [a[left], a[right]];
    if (a[right] < a[middle]) [a[right], a[middle]] = [a[middle], a[right]];
    const pivot = a[middle];
    let i = left;
    let j = right;
    while (i <= j) {
      while (a[i] < pivot) i++;
      while (a[j] > pivot) j--;
      if (i <= j) {
        const t = a[i];
        a[i] = a[j];
        a[j] = t;
        i++;
        j--;
      }
    }
    if (k <= j) right = j;
    else if (k >= i) left = i;
    else return;
  }
}

// Percentiles as numpy.percentile computes them (linear interpolation between
// closest ranks), over the finite values. Returns NaNs for an all-NaN image.
export function percentiles(values, percents) {
  const a = finiteCopy(values);
  const n = a.length;
  if (n === 0) return percents.map(() => NaN);
  // Ascending ranks, so each selection only searches right of the previous one.
  const order = percents.map((percent, index) => ({ index, rank: (Math.min(100, Math.max(0, percent)) / 100) * (n - 1) }))
    .sort((x, y) => x.rank - y.rank);
  const results = new Array(percents.length);
  let left = 0;
  for (const { index, rank } of order) {
    const lower = Math.floor(rank);
    const fraction = rank - lower;
    select(a, lower, left);
    left = lower;
    const low = a[lower];
    if (fraction === 0 || lower + 1 >= n) {
      results[index] = low;
      continue;
    }
    // The next order statistic: everything right of `lower` is >= a[lower].
    select(a, lower + 1, lower + 1);
    results[index] = low + (a[lower + 1] - low) * fraction;
  }
  return results;
}

export function finiteRange(values) {
  let min = Infinity;
  let max = -Infinity;
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v < min) min = v;
    if (v > max) max = v;
  }
  return min <= max ? [min, max] : [NaN, NaN];
}

// Counts of finite values in `bins` equal bins over [min, max].
export function histogram(values, bins, min, max) {
  const counts = new Uint32Array(bins);
  if (!(max > min)) {
    counts[0] = values.length;
    return counts;
  }
  const scale = bins / (max - min);
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (!Number.isFinite(v)) continue;
    let bin = Math.floor((v - min) * scale);
    if (bin >= bins) bin = bins - 1;
    if (bin < 0) bin = 0;
    counts[bin]++;
  }
  return counts;
}

// Maps values into imageData (same width x height) through a 256-entry RGBA
// lookup table, with `low` and `high` the ends of the colour scale.
export function renderInto(imageData, values, low, high, table) {
  const pixels = imageData.data;
  const span = high > low ? high - low : 1;
  const scale = 255 / span;
  for (let i = 0, p = 0; i < values.length; i++, p += 4) {
    let level = (values[i] - low) * scale;
    level = level > 0 ? (level < 255 ? level | 0 : 255) : 0;  // NaN -> 0
    const t = level * 4;
    pixels[p] = table[t];
    pixels[p + 1] = table[t + 1];
    pixels[p + 2] = table[t + 2];
    pixels[p + 3] = 255;
  }
}

// Sizes `canvas` to its CSS box (width × height when it has none) at the
// screen's pixel ratio and returns its cleared 2-D context, which draws in CSS
// pixels, with that box's size.
export function clearedCanvas(canvas, width, height) {
  const ratio = window.devicePixelRatio || 1;
  const cssWidth = canvas.clientWidth || width;
  const cssHeight = canvas.clientHeight || height;
  canvas.width = Math.round(cssWidth * ratio);
  canvas.height = Math.round(cssHeight * ratio);
  const context = canvas.getContext("2d");
  context.setTransform(ratio, 0, 0, ratio, 0, 0);
  context.clearRect(0, 0, cssWidth, cssHeight);
  return { context, cssWidth, cssHeight };
}
