// The field table (catalog/acquisition_fields.hpp) and the formats generated
// from it: each record's list visits as many members as the struct has (the
// header's structured bindings fail the build when a member is added to a
// struct; this fails when a line is dropped from a list), and an Acquisition
// with every field set to a value other than its default survives the
// inspector's wire format and the catalog cache file unchanged.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "acquisition_equality.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/catalog/acquisition_fields.hpp"
#include "quantem/catalog/catalog_cache.hpp"
#include "quantem/inspector/wire.hpp"

namespace quantem::catalog {
namespace {

// Counts the members each list visits, per record type.
struct CountMembers {
  std::size_t visited = 0;
  template <typename T>
  void operator()(const char*, const T&) {
    ++visited;
  }
};

template <typename Record>
std::size_t members_visited() {
  CountMembers count;
  const Record record{};
  for_each_field(count, record);
  return count.visited;
}

// Expects every field of `set` to differ from the same field of `unset`; a
// list of records must be non-empty, and each of its records differ from a
// default record in every field.
struct ExpectEveryFieldSet {
  template <typename T>
  void operator()(const char* name, const T& set, const T& unset) {
    if constexpr (has_fields_v<T>) {
      for_each_field(*this, set, unset);
    } else if constexpr (is_record_list_v<T>) {
      ASSERT_FALSE(set.empty()) << name;
      const typename T::value_type default_record{};
      for (const auto& record : set) for_each_field(*this, record, default_record);
    } else {
      EXPECT_NE(set, unset) << name << " keeps its default value";
    }
  }
};

Shard full_shard(int index, std::uint64_t frames) {
  Shard shard;
  shard.link_name = "data_00000" + std::to_string(index);
  shard.file_path = "/data/full_data_00000" + std::to_string(index) + ".h5";
  shard.dataset_path = "/entry/data/data";
  shard.external = true;
  shard.exists = true;
  shard.frame_count = frames;
  return shard;
}

SignatureEntry full_signature_entry(const std::string& path, std::uint64_t inode) {
  SignatureEntry entry;
  entry.path = path;
  entry.exists = true;
  entry.size_bytes = 9'007'199'254'740'993;  // 2^53 + 1: kept exactly, not as a double
  entry.mtime_ns = 1'700'000'000'123'456'789;
  entry.ctime_ns = -1'700'000'000'123'456'789;
  entry.device = 0xfd01;
  entry.inode = inode;
  return entry;
}

// A loadable acquisition (the wire format checks what inspect_master
// guarantees of one) with no field at its default.
Acquisition every_field_set() {
  Acquisition a;
  a.master_path = "/data/full_master.h5";
  a.name = "full_master.h5";
  a.stem = "full";
  a.scan_rows = 2;
  a.scan_cols = 3;
  a.detector_rows = 2;
  a.detector_cols = 4;
  a.scan_shape_basis = "root dataset scan_shape";
  a.dtype = DType::uint32;
  a.chunk_format.filter = codec::ChunkFilter::lz4;
  a.chunk_format.element_size = 4;
  a.shards = {full_shard(1, 2), full_shard(2, 4)};
  a.stored_frames = 6;
  a.expected_frames = 6;
  a.ntrigger = 6;
  a.nimages = 1;
  a.pixel_mask = {1, 1, 0, 0, 0, 1, 0, 0};
  a.masked_pixel_count = 3;
  a.size_bytes = 18'446'744'073'709'551'557ull;  // near 2^64: kept exactly
  a.status.loadable = true;
  a.status.reason = "a reason";
  a.status.action = "an action";
  a.scan_sampling_A = 0.1;
  a.k_pixel_size_mrad = 1.0 / 3.0;
  a.signature = {full_signature_entry(a.master_path, 11), full_signature_entry(a.shards[0].file_path, 12)};
  return a;
}

TEST(AcquisitionFields, EachListVisitsEveryMember) {
  EXPECT_EQ(members_visited<Acquisition>(), Fields<Acquisition>::kMembers);
  EXPECT_EQ(members_visited<Shard>(), Fields<Shard>::kMembers);
  EXPECT_EQ(members_visited<SignatureEntry>(), Fields<SignatureEntry>::kMembers);
  EXPECT_EQ(members_visited<LoadStatus>(), Fields<LoadStatus>::kMembers);
  EXPECT_EQ(members_visited<codec::ChunkFormat>(), Fields<codec::ChunkFormat>::kMembers);
}

TEST(AcquisitionFields, TheFixtureSetsEveryField) {
  ExpectEveryFieldSet expect;
  const Acquisition set = every_field_set();
  const Acquisition unset;
  for_each_field(expect, set, unset);
}

TEST(AcquisitionFields, EveryFieldSurvivesTheWireFormat) {
  const Acquisition original = every_field_set();
  const Acquisition back = inspector::acquisition_from_json(inspector::acquisition_to_json(original));
  test::expect_same_acquisition(back, original);
  const Acquisition replied = inspector::parse_reply(
      nlohmann::json({{"acquisition", inspector::acquisition_to_json(original)}}).dump(), original.master_path);
  test::expect_same_acquisition(replied, original);
}

TEST(AcquisitionFields, EveryFieldSurvivesTheCatalogCache) {
  const Acquisition original = every_field_set();
  const auto decoded = decode_catalog_cache(encode_catalog_cache("/data", {&original}), "/data");
  ASSERT_EQ(decoded.size(), 1u);
  ASSERT_EQ(decoded.count(original.master_path), 1u);
  test::expect_same_acquisition(decoded.at(original.master_path), original);
}

}  // namespace
}  // namespace quantem::catalog
