// Physical units of the images: the catalog's `scan_sampling_A` (Å per scan
// step) and `k_pixel_size_mrad` (mrad per detector pixel), scaled by the
// plan's bins. Scale bars and readouts use these; without a calibration the
// page says "uncalibrated" and shows pixels only.

// The largest of 1, 2, 5 × 10^n not above `value` (value > 0).
export function niceFloor(value) {
  const power = 10 ** Math.floor(Math.log10(value));
  for (const multiple of [5, 2, 1]) {
    if (multiple * power <= value * (1 + 1e-12)) return multiple * power;
  }
  return power;
}

// A length in Å as text: nm from 10 Å up, Å below.
export function formatLength(angstrom) {
  if (Math.abs(angstrom) >= 10) return `${trim(angstrom / 10)} nm`;
  return `${trim(angstrom)} Å`;
}

export function formatAngle(mrad) {
  return `${trim(mrad)} mrad`;
}

function trim(value) {
  return String(Number(value.toPrecision(4)));
}

// Units of one image axis: {size, unit, label(value)} per displayed pixel, or null.
export function realspaceUnits(entry, plan) {
  const sampling = entry && entry.scan_sampling_A;
  if (!(sampling > 0)) return null;
  return { size: sampling * plan.scan_bin, unit: "Å", format: formatLength };
}

export function diffractionUnits(entry, plan) {
  const sampling = entry && entry.k_pixel_size_mrad;
  if (!(sampling > 0)) return null;
  return { size: sampling * plan.det_bin, unit: "mrad", format: formatAngle };
}

// The bar for an image `width` pixels wide: about a quarter of it, a round value.
export function scaleBar(units, width) {
  const value = niceFloor(0.25 * width * units.size);
  return { value, pixels: value / units.size, label: units.format(value) };
}

// Draws a bar of `length` device pixels with its label, bottom left of the
// overlay, white on a dark plate (legible on any image). Returns where the
// bar's white line lies: {x0, x1, y} in device pixels.
export function drawScaleBar(context, length, label, ratio) {
  const margin = 10 * ratio;
  const thickness = Math.max(2, Math.round(4 * ratio));
  context.save();
  context.font = `${Math.round(12 * ratio)}px system-ui, sans-serif`;
  const textWidth = context.measureText(label).width;
  const plateWidth = Math.max(length, textWidth) + 8 * ratio;
  const plateHeight = thickness + 20 * ratio;
  const x0 = Math.round(margin + 4 * ratio);
  const y = Math.round(context.canvas.height - margin - 4 * ratio - thickness);
  context.fillStyle = "rgba(0,0,0,0.6)";
  context.fillRect(margin, y - 16 * ratio, plateWidth, plateHeight);
  context.fillStyle = "#ffffff";
  context.fillRect(x0, y, Math.round(length), thickness);
  context.textBaseline = "bottom";
  context.fillText(label, x0, y - 3 * ratio);
  context.restore();
  return { x0, x1: x0 + Math.round(length), y, thickness };
}

// A quantity of the metadata panel in its unit ("V", "eV", "m", "s", "Å", or
// none) with an SI prefix: 300000 V -> "300 kV", 9.95e-5 s -> "99.5 µs".
export function formatQuantity(value, unit) {
  if (typeof value !== "number" || !unit) return String(value);
  const prefixes = {
    V: [[1e6, "M"], [1e3, "k"], [1, ""]],
    eV: [[1e6, "M"], [1e3, "k"], [1, ""]],
    m: [[1, ""], [1e-3, "m"], [1e-6, "µ"], [1e-9, "n"]],
    s: [[1, ""], [1e-3, "m"], [1e-6, "µ"], [1e-9, "n"]],
  }[unit];
  if (!prefixes) return `${trim(value)} ${unit}`;
  const magnitude = Math.abs(value);
  const [factor, prefix] = prefixes.find(([f]) => magnitude >= f * (1 - 1e-12)) || prefixes[prefixes.length - 1];
  return `${trim(value / factor)} ${prefix}${unit}`;
}
