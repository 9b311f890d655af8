// Colour maps as 256-entry RGB lookup tables, interpolated linearly between a
// few control colours (9 evenly spaced samples of matplotlib's maps; close to
// the originals, not bit-identical).

const controlColors = {
  gray: ["#000000", "#ffffff"],
  viridis: ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962", "#addc30", "#fde725"],
  inferno: ["#000004", "#1f0c48", "#550f6d", "#88226a", "#ba3655", "#e35933", "#f98e09", "#f9cb35", "#fcffa4"],
  magma: ["#000004", "#1c1044", "#4f127b", "#812581", "#b5367a", "#e55964", "#fb8761", "#fec287", "#fcfdbf"],
  // Diverging, for signed maps (CoM): blue below the middle of the limits, red above.
  coolwarm: ["#3b4cc0", "#6788ee", "#9abbff", "#c9d7f0", "#edd1c2", "#f7a889", "#e26952", "#b40426"],
};

export const colormapNames = Object.keys(controlColors);

function hexToRgb(hex) {
  const value = parseInt(hex.slice(1), 16);
  return [(value >> 16) & 255, (value >> 8) & 255, value & 255];
}

const cache = new Map();

// Uint8Array(256 * 4): RGBA for each of 256 levels.
export function lookupTable(name) {
  if (cache.has(name)) return cache.get(name);
  const colors = (controlColors[name] || controlColors.gray).map(hexToRgb);
  const table = new Uint8Array(256 * 4);
  const segments = colors.length - 1;
  for (let level = 0; level < 256; level++) {
    const position = (level / 255) * segments;
    const index = Math.min(segments - 1, Math.floor(position));
    const fraction = position - index;
    for (let channel = 0; channel < 3; channel++) {
      const a = colors[index][channel];
      const b = colors[index + 1][channel];
      table[level * 4 + channel] = Math.round(a + (b - a) * fraction);
    }
    table[level * 4 + 3] = 255;
  }
  cache.set(name, table);
  return table;
}

// CSS colour of a level in [0, 1] (histogram bars).
export function cssColor(name, fraction) {
  const table = lookupTable(name);
  const level = Math.max(0, Math.min(255, Math.round(fraction * 255)));
  return `rgb(${table[level * 4]},${table[level * 4 + 1]},${table[level * 4 + 2]})`;
}
