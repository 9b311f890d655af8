#pragma once
// The one list of an Acquisition's fields. Every format that carries a whole
// Acquisition walks it: the inspector's JSON wire format (inspector/wire.hpp),
// the catalog cache file (catalog_cache.hpp) and the tests' comparator. A
// member added to Acquisition, Shard, SignatureEntry, LoadStatus or
// codec::ChunkFormat is one line added here, and every format carries it.
//
//   for_each_field(visit, objects...)
//
// calls visit(name, objects.member...) for each member of the objects' record
// type, in declaration order; the objects are one record type, const or not
// (two of them for a comparison). `name` is the member's key in the wire
// format. A member that is itself a record (has_fields_v: LoadStatus, the
// chunk format) or a list of records (Shard, SignatureEntry) is passed as it
// is; a visitor walks it with for_each_field again. The pixel mask is passed
// as the vector it is; both formats carry it as runs (pixel_mask_runs below).
//
// Each record's member count is guarded: a structured binding must name every
// member of the struct, so MembersCounted below compiles only while each record
// has exactly Fields<T>::kMembers members. A member added to a struct fails
// the build there until it is listed here (and kMembers raised); the
// AcquisitionFields tests check that each list visits kMembers members.
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "quantem/catalog/acquisition.hpp"
#include "quantem/codec/chunk_codec.hpp"

namespace quantem::catalog {

template <typename Record>
struct Fields;  // specialised for each record below

template <typename T, typename = void>
struct has_fields : std::false_type {};
template <typename T>
struct has_fields<T, std::void_t<decltype(Fields<std::remove_const_t<T>>::kMembers)>> : std::true_type {};
template <typename T>
inline constexpr bool has_fields_v = has_fields<T>::value;

// A list of records (std::vector<Shard>, std::vector<SignatureEntry>).
template <typename T>
struct is_record_list : std::false_type {};
template <typename T>
struct is_record_list<std::vector<T>> : has_fields<T> {};
template <typename T>
inline constexpr bool is_record_list_v = is_record_list<std::remove_const_t<T>>::value;

template <typename Visitor, typename First, typename... More>
void for_each_field(Visitor&& visit, First& first, More&... more) {
  static_assert((std::is_same_v<std::remove_const_t<First>, std::remove_const_t<More>> && ...),
                "for_each_field walks objects of one record type");
  Fields<std::remove_const_t<First>>::each(visit, first, more...);
}

template <>
struct Fields<LoadStatus> {
  static constexpr std::size_t kMembers = 3;
  template <typename Visitor, typename... Objects>
  static void each(Visitor& visit, Objects&... o) {
    visit("loadable", o.loadable...);
    visit("reason", o.reason...);
    visit("action", o.action...);
  }
};

template <>
struct Fields<codec::ChunkFormat> {
  static constexpr std::size_t kMembers = 2;
  template <typename Visitor, typename... Objects>
  static void each(Visitor& visit, Objects&... o) {
    visit("chunk_filter", o.filter...);
    visit("chunk_element_size", o.element_size...);
  }
};

template <>
struct Fields<Shard> {
  static constexpr std::size_t kMembers = 6;
  template <typename Visitor, typename... Objects>
  static void each(Visitor& visit, Objects&... o) {
    visit("link_name", o.link_name...);
    visit("file_path", o.file_path...);
    visit("dataset_path", o.dataset_path...);
    visit("external", o.external...);
    visit("exists", o.exists...);
    visit("frame_count", o.frame_count...);
  }
};

template <>
struct Fields<SignatureEntry> {
  static constexpr std::size_t kMembers = 7;
  template <typename Visitor, typename... Objects>
  static void each(Visitor& visit, Objects&... o) {
    visit("path", o.path...);
    visit("exists", o.exists...);
    visit("size_bytes", o.size_bytes...);
    visit("mtime_ns", o.mtime_ns...);
    visit("ctime_ns", o.ctime_ns...);
    visit("device", o.device...);
    visit("inode", o.inode...);
  }
};

template <>
struct Fields<Acquisition> {
  static constexpr std::size_t kMembers = 22;
  template <typename Visitor, typename... Objects>
  static void each(Visitor& visit, Objects&... o) {
    visit("master_path", o.master_path...);
    visit("name", o.name...);
    visit("stem", o.stem...);
    visit("scan_rows", o.scan_rows...);
    visit("scan_cols", o.scan_cols...);
    visit("detector_rows", o.detector_rows...);
    visit("detector_cols", o.detector_cols...);
    visit("scan_shape_basis", o.scan_shape_basis...);
    visit("dtype", o.dtype...);
    visit("chunk_format", o.chunk_format...);  // a record: its members' keys are chunk_filter, chunk_element_size
    visit("shards", o.shards...);
    visit("stored_frames", o.stored_frames...);
    visit("expected_frames", o.expected_frames...);
    visit("ntrigger", o.ntrigger...);
    visit("nimages", o.nimages...);
    visit("pixel_mask_runs", o.pixel_mask...);
    visit("masked_pixel_count", o.masked_pixel_count...);
    visit("size_bytes", o.size_bytes...);
    visit("status", o.status...);  // a record: its members' keys are loadable, reason, action
    visit("scan_sampling_A", o.scan_sampling_A...);
    visit("k_pixel_size_mrad", o.k_pixel_size_mrad...);
    visit("signature", o.signature...);
  }
};

namespace detail {
// Compiles only while each record has exactly Fields<T>::kMembers members
// (a structured binding names every member); never called.
struct MembersCounted {
  static void check(LoadStatus& s) { [[maybe_unused]] auto& [m1, m2, m3] = s; }
  static void check(codec::ChunkFormat& f) { [[maybe_unused]] auto& [m1, m2] = f; }
  static void check(Shard& s) { [[maybe_unused]] auto& [m1, m2, m3, m4, m5, m6] = s; }
  static void check(SignatureEntry& e) { [[maybe_unused]] auto& [m1, m2, m3, m4, m5, m6, m7] = e; }
  static void check(Acquisition& a) {
    [[maybe_unused]] auto& [m1, m2, m3, m4, m5, m6, m7, m8, m9, m10, m11, m12, m13, m14, m15, m16, m17, m18, m19,
                            m20, m21, m22] = a;
  }
};
}  // namespace detail

// The pixel mask as both formats carry it: alternating run lengths of
// unmasked and masked pixels in row-major order, starting with unmasked (the
// first run is 0 when the first pixel is masked). Empty for an empty mask.
std::vector<std::uint64_t> pixel_mask_runs(const std::vector<std::uint8_t>& mask);

// The mask the runs describe, which must cover exactly `pixels` pixels, and
// its masked pixel count. Returns nullptr, or what does not add up (the
// caller's error names its format).
const char* pixel_mask_from_runs(const std::vector<std::uint64_t>& runs, std::uint64_t pixels,
                                 std::vector<std::uint8_t>& mask, std::uint64_t& masked_pixels);

}  // namespace quantem::catalog
