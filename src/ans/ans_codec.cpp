// CPU reference of the ANS resident codec. Straight loops over the format of
// ans_format.hpp; the model arithmetic is shared with the CUDA encoder through
// ans_model.hpp so both write the same bytes.
#include "quantem/ans/ans_codec.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <string>

#include "quantem/ans/ans_model.hpp"
#include "quantem/core/error.hpp"

namespace quantem::ans {
namespace {

std::uint32_t load_value(const void* data, DType dtype, std::size_t index) {
  switch (dtype) {
    case DType::uint8: return static_cast<const std::uint8_t*>(data)[index];
    case DType::uint16: {
      std::uint16_t v;
      std::memcpy(&v, static_cast<const std::uint8_t*>(data) + 2 * index, 2);
      return v;
    }
    case DType::uint32: {
      std::uint32_t v;
      std::memcpy(&v, static_cast<const std::uint8_t*>(data) + 4 * index, 4);
      return v;
    }
  }
  return 0;
}

template <class T>
void store_le(std::uint8_t* p, T value) {
  std::memcpy(p, &value, sizeof(T));
}
template <class T>
T load_le(const std::uint8_t* p) {
  T value;
  std::memcpy(&value, p, sizeof(T));
  return value;
}

// The pixels of stream s by quad position k = 2 dr + dc (coding order), and a
// bit mask of the positions inside the detector.
std::uint32_t quad_pixels(const AnsGroupLayout& layout, std::uint32_t rows, std::uint32_t cols, std::uint32_t stream,
                          std::array<std::uint32_t, 4>& pixels) {
  const std::uint32_t quad_row = stream / layout.quad_cols;
  const std::uint32_t quad_col = stream % layout.quad_cols;
  std::uint32_t present = 0;
  for (std::uint32_t k = 0; k < 4; ++k) {
    const std::uint32_t r = 2 * quad_row + k / 2;
    const std::uint32_t c = 2 * quad_col + k % 2;
    pixels[k] = r * cols + c;
    if (r < rows && c < cols) present |= 1u << k;
  }
  return present;
}

[[noreturn]] void corrupt(const std::string& what) { throw CorruptChunk("ANS group: " + what); }

// The steps of encode_group, in order.
// Values of the group's frames, frame-major.
struct GroupValues {
  const HostFrames& frames;
  std::uint32_t pixels;
  std::uint32_t operator()(std::uint32_t frame, std::uint32_t pixel) const {
    return load_value(frames.data, frames.dtype, std::size_t{frame} * pixels + pixel);
  }
};

// The group's symbol model: per-pixel sums -> class scale -> classes ->
// per-class symbol counts -> frequencies and their cumulative tables.
struct GroupModel {
  std::uint32_t raw_words = 1;
  std::uint32_t class_scale = 0;
  std::vector<std::uint8_t> classes;     // per pixel
  std::vector<std::uint32_t> shifts;     // per class
  std::vector<std::uint16_t> frequencies;  // [class][symbol]
  std::vector<std::uint32_t> cdfs;         // [class][symbol]
};

GroupModel build_model(const GroupValues& value_at, std::uint32_t frame_count) {
  const std::uint32_t pixels = value_at.pixels;
  GroupModel model;
  std::vector<std::uint64_t> pixel_sums(pixels, 0);
  std::uint32_t max_value = 0;
  for (std::uint32_t f = 0; f < frame_count; ++f)
    for (std::uint32_t p = 0; p < pixels; ++p) {
      const std::uint32_t v = value_at(f, p);
      pixel_sums[p] += v;
      max_value = std::max(max_value, v);
    }
  model.raw_words = max_value > 0xffffu ? 2 : 1;
  std::vector<std::uint64_t> histogram(kAnsClassHistogramBins, 0);
  for (std::uint32_t p = 0; p < pixels; ++p) ++histogram[class_histogram_bin(pixel_sums[p], frame_count)];
  const std::uint64_t quantile = class_quantile_pixels(pixels);
  std::uint32_t high_bin = 0;
  for (std::uint64_t cumulative = 0; high_bin < kAnsClassHistogramBins; ++high_bin) {
    cumulative += histogram[high_bin];
    if (cumulative >= quantile) break;
  }
  model.class_scale = class_scale_from_bin(high_bin);
  model.classes.resize(pixels);
  for (std::uint32_t p = 0; p < pixels; ++p)
    model.classes[p] = static_cast<std::uint8_t>(pixel_class(pixel_sums[p], frame_count, model.class_scale));
  model.shifts.resize(kAnsClassCount);
  for (std::uint32_t c = 0; c < kAnsClassCount; ++c) model.shifts[c] = class_shift(c, model.class_scale);
  std::vector<std::uint64_t> counts(std::size_t{kAnsClassCount} * kAnsAlphabetSize, 0);
  for (std::uint32_t f = 0; f < frame_count; ++f)
    for (std::uint32_t p = 0; p < pixels; ++p) {
      const std::uint8_t cls = model.classes[p];
      ++counts[std::size_t{cls} * kAnsAlphabetSize + value_symbol(value_at(f, p), model.shifts[cls])];
    }
  model.frequencies.resize(std::size_t{kAnsClassCount} * kAnsAlphabetSize);
  model.cdfs.resize(std::size_t{kAnsClassCount} * kAnsAlphabetSize);
  for (std::uint32_t c = 0; c < kAnsClassCount; ++c) {
    const std::size_t table = std::size_t{c} * kAnsAlphabetSize;
    normalize_frequencies(&counts[table], &model.frequencies[table]);
    std::uint32_t cumulative = 0;
    for (std::uint32_t s = 0; s < kAnsAlphabetSize; ++s) {
      model.cdfs[table + s] = cumulative;
      cumulative += model.frequencies[table + s];
    }
  }
  return model;
}

// Every stream's words (in emission order) and final states.
struct GroupStreams {
  std::vector<std::vector<std::uint16_t>> words;
  std::vector<std::array<std::uint32_t, kAnsStatesPerStream>> final_states;
};

// Encodes each quad backwards (one state per quad position).
GroupStreams encode_streams(const AnsGroupLayout& layout, std::uint32_t rows, std::uint32_t cols,
                            std::uint32_t frame_count, const GroupModel& model, const GroupValues& value_at) {
  GroupStreams streams;
  streams.words.resize(layout.stream_count);
  streams.final_states.resize(layout.stream_count);
  for (std::uint32_t s = 0; s < layout.stream_count; ++s) {
    std::array<std::uint32_t, 4> quad{};
    const std::uint32_t present = quad_pixels(layout, rows, cols, s, quad);
    std::array<std::uint32_t, kAnsStatesPerStream> states;
    states.fill(kAnsStateLower);
    std::vector<std::uint16_t>& emitted = streams.words[s];
    auto push = [&](std::uint32_t word) {
      if (word != kAnsNoWord) emitted.push_back(static_cast<std::uint16_t>(word));
    };
    for (std::uint32_t f = frame_count; f-- > 0;) {
      for (std::uint32_t k = 4; k-- > 0;) {
        if (((present >> k) & 1u) == 0) continue;
        const std::uint32_t pixel = quad[k];
        const std::size_t table = std::size_t{model.classes[pixel]} * kAnsAlphabetSize;
        encode_value(
            states[k], value_at(f, pixel), model.shifts[model.classes[pixel]],
            [&](std::uint32_t& state, std::uint32_t symbol) {
              return encode_symbol(state, model.frequencies[table + symbol], model.cdfs[table + symbol]);
            },
            push);
      }
    }
    streams.final_states[s] = states;
  }
  return streams;
}

// The group's bytes: header, class map, frequency tables, stream offsets, then
// each stream's states and its words in read order.
std::vector<std::uint8_t> write_group(const AnsGroupLayout& layout, std::uint32_t rows, std::uint32_t cols,
                                      std::uint32_t frame_count, const GroupModel& model, const GroupStreams& streams) {
  std::uint64_t data_bytes = 0;
  std::vector<std::uint32_t> stream_offsets(layout.stream_count);
  for (std::uint32_t s = 0; s < layout.stream_count; ++s) {
    stream_offsets[s] = static_cast<std::uint32_t>(data_bytes);
    data_bytes += ans_stream_bytes(streams.words[s].size());
  }
  const std::uint64_t total = layout.stream_data_offset + data_bytes;
  if (total > 0xffffffffu) throw bad_request("encode_group: group larger than 4 GiB; use fewer frames per group");
  std::vector<std::uint8_t> blob(static_cast<std::size_t>(total), 0);
  const AnsGroupHeader header =
      ans_group_header(layout, frame_count, rows, cols, model.raw_words, model.class_scale, data_bytes);
  std::memcpy(blob.data(), &header, sizeof header);
  std::memcpy(blob.data() + layout.class_map_offset, model.classes.data(), model.classes.size());
  for (std::size_t i = 0; i < model.frequencies.size(); ++i)
    store_le<std::uint16_t>(blob.data() + layout.freq_table_offset + 2 * i, model.frequencies[i]);
  for (std::uint32_t s = 0; s < layout.stream_count; ++s) {
    store_le<std::uint32_t>(blob.data() + layout.stream_offsets_offset + 4 * std::size_t{s}, stream_offsets[s]);
    std::uint8_t* stream = blob.data() + layout.stream_data_offset + stream_offsets[s];
    for (std::uint32_t k = 0; k < kAnsStatesPerStream; ++k)
      store_le<std::uint32_t>(stream + 4 * k, streams.final_states[s][k]);
    const std::vector<std::uint16_t>& words = streams.words[s];
    for (std::size_t k = 0; k < words.size(); ++k)  // the last word emitted is read first
      store_le<std::uint16_t>(stream + kAnsStreamHeaderBytes + 2 * k, words[words.size() - 1 - k]);
  }
  return blob;
}

}  // namespace

std::vector<std::uint8_t> encode_group(const HostFrames& frames) {
  if (frames.frame_count == 0 || frames.detector_rows == 0 || frames.detector_cols == 0)
    throw bad_request("encode_group: empty shape");
  const std::uint32_t rows = frames.detector_rows;
  const std::uint32_t cols = frames.detector_cols;
  const AnsGroupLayout layout = ans_group_layout(rows, cols);
  const GroupValues value_at{frames, rows * cols};
  const GroupModel model = build_model(value_at, frames.frame_count);
  const GroupStreams streams = encode_streams(layout, rows, cols, frames.frame_count, model, value_at);
  return write_group(layout, rows, cols, frames.frame_count, model, streams);
}

AnsGroupHeader read_group_header(const std::uint8_t* blob, std::size_t bytes) {
  if (bytes < kAnsHeaderBytes) corrupt("shorter than its header");
  AnsGroupHeader header;
  std::memcpy(&header, blob, sizeof header);
  if (header.magic != kAnsMagic || header.header_bytes != kAnsHeaderBytes) corrupt("bad magic");
  if (header.frame_count == 0 || header.detector_rows == 0 || header.detector_cols == 0) corrupt("empty shape");
  if (header.raw_words != 1 && header.raw_words != 2) corrupt("raw_words must be 1 or 2");
  if (header.class_scale < 1 || header.class_scale > 4096) corrupt("class scale out of range");
  const AnsGroupLayout layout = ans_group_layout(header.detector_rows, header.detector_cols);
  if (header.stream_count != layout.stream_count || header.class_map_offset != layout.class_map_offset ||
      header.freq_table_offset != layout.freq_table_offset ||
      header.stream_offsets_offset != layout.stream_offsets_offset ||
      header.stream_data_offset != layout.stream_data_offset)
    corrupt("layout does not match the detector shape");
  if (header.total_bytes != header.stream_data_offset + header.stream_data_bytes || header.total_bytes > bytes)
    corrupt("sizes do not add up");
  return header;
}

namespace {

struct DecodeTables {
  std::vector<std::uint8_t> symbol;    // [class][slot]
  std::vector<std::uint16_t> frequency;  // [class][symbol]
  std::vector<std::uint16_t> cdf;        // [class][symbol]
};

DecodeTables build_tables(const std::uint8_t* blob, const AnsGroupHeader& header) {
  DecodeTables tables;
  tables.symbol.assign(std::size_t{kAnsClassCount} * kAnsProbabilityScale, 0);
  tables.frequency.assign(std::size_t{kAnsClassCount} * kAnsAlphabetSize, 0);
  tables.cdf.assign(std::size_t{kAnsClassCount} * kAnsAlphabetSize, 0);
  for (std::uint32_t c = 0; c < kAnsClassCount; ++c) {
    std::uint32_t cumulative = 0;
    for (std::uint32_t s = 0; s < kAnsAlphabetSize; ++s) {
      const std::size_t entry = std::size_t{c} * kAnsAlphabetSize + s;
      const std::uint16_t f = load_le<std::uint16_t>(blob + header.freq_table_offset + 2 * entry);
      tables.frequency[entry] = f;
      tables.cdf[entry] = static_cast<std::uint16_t>(cumulative);
      if (cumulative + f > kAnsProbabilityScale) corrupt("class " + std::to_string(c) + " frequencies exceed the scale");
      for (std::uint32_t slot = cumulative; slot < cumulative + f; ++slot)
        tables.symbol[std::size_t{c} * kAnsProbabilityScale + slot] = static_cast<std::uint8_t>(s);
      cumulative += f;
    }
    if (cumulative != 0 && cumulative != kAnsProbabilityScale) corrupt("class " + std::to_string(c) + " frequencies do not sum to the scale");
  }
  return tables;
}

// Decodes every stream, calling sink(frame, pixel, value).
template <class Sink>
void decode_streams(const std::uint8_t* blob, const AnsGroupHeader& header, Sink&& sink) {
  const DecodeTables tables = build_tables(blob, header);
  const AnsGroupLayout layout = ans_group_layout(header.detector_rows, header.detector_cols);
  std::uint32_t shifts[kAnsClassCount];
  for (std::uint32_t c = 0; c < kAnsClassCount; ++c) shifts[c] = class_shift(c, header.class_scale);
  const std::uint8_t* classes = blob + header.class_map_offset;
  const std::uint8_t* data = blob + header.stream_data_offset;
  for (std::uint32_t s = 0; s < header.stream_count; ++s) {
    const std::uint64_t begin = load_le<std::uint32_t>(blob + header.stream_offsets_offset + 4 * std::size_t{s});
    const std::uint64_t end = s + 1 < header.stream_count
                                  ? load_le<std::uint32_t>(blob + header.stream_offsets_offset + 4 * std::size_t{s + 1})
                                  : header.stream_data_bytes;
    if (begin > end || end > header.stream_data_bytes || end - begin < kAnsStreamHeaderBytes ||
        begin % kAnsStreamAlignment != 0 || (end - begin) % kAnsStreamAlignment != 0)
      corrupt("stream " + std::to_string(s) + " has invalid bounds");
    std::uint64_t position = begin + kAnsStreamHeaderBytes;
    std::array<std::uint32_t, kAnsStatesPerStream> states;
    for (std::uint32_t k = 0; k < kAnsStatesPerStream; ++k) states[k] = load_le<std::uint32_t>(data + begin + 4 * k);
    auto next_word = [&]() -> std::uint32_t {
      if (position + 2 > end) corrupt("stream " + std::to_string(s) + " read past its end");
      const std::uint32_t word = load_le<std::uint16_t>(data + position);
      position += 2;
      return word;
    };
    std::array<std::uint32_t, 4> quad{};
    const std::uint32_t present = quad_pixels(layout, header.detector_rows, header.detector_cols, s, quad);
    for (std::uint32_t f = 0; f < header.frame_count; ++f) {
      for (std::uint32_t k = 0; k < 4; ++k) {
        if (((present >> k) & 1u) == 0) continue;
        std::uint32_t& state = states[k];
        const std::uint32_t pixel = quad[k];
        const std::uint32_t cls = classes[pixel];
        if (cls >= kAnsClassCount) corrupt("pixel class out of range");
        const std::uint32_t slot = state & (kAnsProbabilityScale - 1);
        const std::uint32_t symbol = tables.symbol[std::size_t{cls} * kAnsProbabilityScale + slot];
        const std::size_t entry = std::size_t{cls} * kAnsAlphabetSize + symbol;
        if (tables.frequency[entry] == 0) corrupt("slot of an unused class");
        state = tables.frequency[entry] * (state >> kAnsProbabilityBits) + slot - tables.cdf[entry];
        if (state < kAnsStateLower) state = (state << 16) | next_word();
        auto read_bits = [&](std::uint32_t count) {
          const std::uint32_t bits = state & ((1u << count) - 1u);
          state >>= count;
          if (state < kAnsStateLower) state = (state << 16) | next_word();
          return bits;
        };
        std::uint32_t value = symbol;
        if (symbol == kAnsEscape32) {
          if (header.raw_words != 2) corrupt("a 32-bit escape in a 16-bit group");
          value = read_bits(16);
          value |= read_bits(16) << 16;
        } else if (symbol == kAnsEscape16) {
          value = read_bits(16);
        } else if (shifts[cls] != 0) {
          value = (symbol << shifts[cls]) | read_bits(shifts[cls]);
        }
        sink(f, pixel, value);
      }
    }
    for (const std::uint32_t state : states)
      if (state != kAnsStateLower) corrupt("stream " + std::to_string(s) + " does not end cleanly");
    if (end - position >= kAnsStreamAlignment) corrupt("stream " + std::to_string(s) + " does not end cleanly");
    for (; position < end; ++position)
      if (data[position] != 0) corrupt("stream " + std::to_string(s) + " has non-zero padding");
  }
}

}  // namespace

void decode_group(const std::uint8_t* blob, std::size_t bytes, DType out_dtype, void* out) {
  const AnsGroupHeader header = read_group_header(blob, bytes);
  const std::size_t pixels = std::size_t{header.detector_rows} * header.detector_cols;
  if (out_dtype == DType::uint16 && header.raw_words != 1)
    throw bad_request("decode_group: the group holds 32-bit values, uint16 output cannot hold them");
  decode_streams(blob, header, [&](std::uint32_t frame, std::uint32_t pixel, std::uint32_t value) {
    const std::size_t index = frame * pixels + pixel;
    switch (out_dtype) {
      case DType::uint8:
        if (value > 0xff) throw bad_request("decode_group: a value does not fit uint8");
        static_cast<std::uint8_t*>(out)[index] = static_cast<std::uint8_t>(value);
        break;
      case DType::uint16: store_le<std::uint16_t>(static_cast<std::uint8_t*>(out) + 2 * index, static_cast<std::uint16_t>(value)); break;
      case DType::uint32: store_le<std::uint32_t>(static_cast<std::uint8_t*>(out) + 4 * index, value); break;
    }
  });
}

std::vector<std::uint64_t> masked_sum_group(const std::uint8_t* blob, std::size_t bytes,
                                            const std::uint8_t* detector_mask) {
  const AnsGroupHeader header = read_group_header(blob, bytes);
  std::vector<std::uint64_t> sums(header.frame_count, 0);
  decode_streams(blob, header, [&](std::uint32_t frame, std::uint32_t pixel, std::uint32_t value) {
    if (detector_mask[pixel] != 0) sums[frame] += value;
  });
  return sums;
}

}  // namespace quantem::ans
