#pragma once
// Several images of one plan in one body: the products route's response
// (docs/protocol.md, 'Products of one plan in one request').
//   json: {"images":[{"mode","shape","dtype","value_divisor","encoding":"base64","data"}, ...],
//          "provenance":{...}}, each image's data the base64 of the raw
//          format's bytes (row-major little-endian <u4 or <f4);
//   npz:  an uncompressed (stored) zip of one "<mode>.npy" per image, as
//          numpy.savez writes it, for numpy.load;
//   raw:  the raw format's bodies back to back, no per-byte work; where each
//          image lies in the body is in the x-quantem-images header
//          (bundle_index_json).
// The bytes are a function of the images alone (fixed zip timestamps), so
// equal images give equal bodies.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace quantem::protocol {

// One image of a bundle: the raw format's headers and bytes (WireImage).
struct BundleImage {
  std::string mode;
  std::uint64_t height = 0;
  std::uint64_t width = 0;
  std::string dtype;  // "<u4" or "<f4"
  std::uint64_t value_divisor = 1;
  std::string_view bytes;  // height * width * 4 bytes, little-endian
};

// RFC 4648 base64 with padding.
std::string base64_encode(std::string_view bytes);

// The json bundle; `provenance_json` (a JSON object, provenance_header()) is
// spliced in as it is.
std::string encode_bundle_json(const std::vector<BundleImage>& images, const std::string& provenance_json);

// The raw bundle's body: the images' bytes back to back, in order.
// Written into `into` (its contents dropped, its capacity reused: a recycled
// body pays no page faults).
std::string encode_bundle_raw(const std::vector<BundleImage>& images, std::string into = {});
// The bytes encode_bundle_raw writes.
std::size_t bundle_raw_bytes(const std::vector<BundleImage>& images);
// The raw bundle's index, the x-quantem-images header: a compact JSON array,
// per image {"mode","shape":[rows,columns],"dtype","value_divisor","offset","bytes"}
// (offset and bytes locate the image in the body).
std::string bundle_index_json(const std::vector<BundleImage>& images);

// The npz bundle. Throws quantem::Error(payload_too_large) past the 4 GiB a
// zip without ZIP64 records can hold.
std::string encode_bundle_npz(const std::vector<BundleImage>& images);

// A zip of stored (uncompressed) members, in order. A member's bytes are
// `head` then `body` (an .npy header and the values, neither copied before
// the zip). Names are ASCII; times are the zip epoch (1980-01-01 00:00).
// Same 4 GiB limit.
struct ZipMember {
  std::string name;
  std::string_view head;
  std::string_view body;
};
std::string stored_zip(const std::vector<ZipMember>& members);

}  // namespace quantem::protocol
