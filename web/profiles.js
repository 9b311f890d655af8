// Profiles of a displayed image (the daemon has no route for them): a line
// profile sampled at unit steps along a drawn line, each sample the exact
// value of the pixel that holds it (nearest pixel, no interpolation), and the
// radial average of a diffraction pattern about a centre, one bin per pixel
// of radius (round(r)), each the exact mean of its pixels.

import { clearedCanvas } from "./imaging.js";

// image: {width, height, data, divisor}; line: {r0, c0, r1, c1} in pixel
// indices (pixel centres at integers). -> {x: distance in pixels, y: values}
export function lineProfile(image, line) {
  const length = Math.hypot(line.r1 - line.r0, line.c1 - line.c0);
  const samples = Math.floor(length + 1e-9) + 1;
  const x = new Float64Array(samples);
  const y = new Float64Array(samples);
  const dr = length > 0 ? (line.r1 - line.r0) / length : 0;
  const dc = length > 0 ? (line.c1 - line.c0) / length : 0;
  let kept = 0;
  for (let i = 0; i < samples; i++) {
    const row = Math.round(line.r0 + dr * i);
    const col = Math.round(line.c0 + dc * i);
    if (row < 0 || col < 0 || row >= image.height || col >= image.width) continue;
    x[kept] = i;
    y[kept] = image.data[row * image.width + col] / image.divisor;
    kept++;
  }
  return { x: x.subarray(0, kept), y: y.subarray(0, kept) };
}

// Mean of the pixels at each rounded radius from (row, col) -> {x: radius in pixels, y: mean}.
export function radialProfile(image, centre) {
  const { width, height, data, divisor } = image;
  const maxRadius = Math.ceil(Math.hypot(Math.max(centre.row, height - 1 - centre.row),
    Math.max(centre.col, width - 1 - centre.col))) + 1;
  const sums = new Float64Array(maxRadius + 1);
  const counts = new Float64Array(maxRadius + 1);
  for (let row = 0; row < height; row++) {
    const dy = row - centre.row;
    for (let col = 0; col < width; col++) {
      const bin = Math.round(Math.hypot(col - centre.col, dy));
      const value = data[row * width + col];
      if (!Number.isFinite(value)) continue;
      sums[bin] += value;
      counts[bin]++;
    }
  }
  const x = [];
  const y = [];
  for (let bin = 0; bin <= maxRadius; bin++) {
    if (!counts[bin]) continue;
    x.push(bin);
    y.push(sums[bin] / counts[bin] / divisor);
  }
  return { x: Float64Array.from(x), y: Float64Array.from(y) };
}

// "# comment\nx_name,y_name\n..." with full precision.
export function profileCsv(profile, xName, yName, comment) {
  const lines = [`# ${comment.replace(/\n/g, " ")}`, `${xName},${yName}`];
  for (let i = 0; i < profile.x.length; i++) lines.push(`${profile.x[i]},${profile.y[i]}`);
  return `${lines.join("\n")}\n`;
}

// A line plot with its axes' ends labelled, in CSS pixels of `canvas`.
export function plotProfile(canvas, x, y, xLabel, formatValue) {
  const { context, cssWidth, cssHeight } = clearedCanvas(canvas, 600, 160);
  if (!x.length) return;
  const left = 56;
  const bottom = cssHeight - 18;
  const top = 6;
  const right = cssWidth - 8;
  let low = Infinity;
  let high = -Infinity;
  for (const v of y) {
    if (v < low) low = v;
    if (v > high) high = v;
  }
  if (!(high > low)) high = low + 1;
  const x0 = x[0];
  const x1 = x[x.length - 1] > x0 ? x[x.length - 1] : x0 + 1;
  const px = (v) => left + ((v - x0) / (x1 - x0)) * (right - left);
  const py = (v) => bottom - ((v - low) / (high - low)) * (bottom - top);
  context.strokeStyle = "#2d3441";
  context.strokeRect(left, top, right - left, bottom - top);
  context.strokeStyle = "#4fd1c5";
  context.lineWidth = 1.5;
  context.beginPath();
  for (let i = 0; i < x.length; i++) {
    if (i === 0) context.moveTo(px(x[i]), py(y[i]));
    else context.lineTo(px(x[i]), py(y[i]));
  }
  context.stroke();
  context.fillStyle = "#9aa4b2";
  context.font = "10px system-ui, sans-serif";
  context.textBaseline = "top";
  context.fillText(formatValue(high), 2, top);
  context.textBaseline = "bottom";
  context.fillText(formatValue(low), 2, bottom);
  context.textBaseline = "top";
  context.fillText(formatValue(x0), left, bottom + 3);
  const end = `${formatValue(x1)} ${xLabel}`;
  context.fillText(end, right - context.measureText(end).width, bottom + 3);
}
