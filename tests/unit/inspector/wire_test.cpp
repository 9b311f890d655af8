// The inspector's wire format: a real acquisition survives the round trip
// exactly, and hostile worker replies are refused with a typed error.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "acquisition_equality.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/catalog/master_metadata.hpp"
#include "quantem/catalog/shard_storage.hpp"
#include "quantem/core/error.hpp"
#include "quantem/inspector/wire.hpp"
#include "quantem/synth/synth.hpp"
#include "test_support.hpp"

namespace quantem::inspector {
namespace {

using nlohmann::json;

class InspectorWire : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    synth::SynthOptions options;
    options.output_dir = dir_->path();
    options.prefix = "wire";
    options.scan_rows = 3;
    options.scan_cols = 4;
    options.detector_rows = 16;
    options.detector_cols = 12;
    options.frames_per_shard = 5;  // three shards
    options.bad_pixels = 7;
    options.threads = 1;
    synth::write_acquisition(options);
    acquisition_ = new catalog::Acquisition(catalog::inspect_master(dir_->file("wire_master.h5")));
  }
  static void TearDownTestSuite() {
    delete acquisition_;
    delete dir_;
  }
  static json good() { return json({{"acquisition", acquisition_to_json(*acquisition_)}}); }
  static void expect_refused(const json& reply, const std::string& why) {
    SCOPED_TRACE(why);
    try {
      (void)parse_reply(reply.dump(), acquisition_->master_path);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::corrupt_data) << e.what();
    }
  }
  static test::TempDir* dir_;
  static catalog::Acquisition* acquisition_;
};

test::TempDir* InspectorWire::dir_ = nullptr;
catalog::Acquisition* InspectorWire::acquisition_ = nullptr;

TEST_F(InspectorWire, RoundTripIsExact) {
  ASSERT_TRUE(acquisition_->status.loadable) << acquisition_->status.reason;
  ASSERT_EQ(acquisition_->masked_pixel_count, 7u);
  ASSERT_EQ(acquisition_->shards.size(), 3u);
  const catalog::Acquisition back = parse_reply(good().dump(), acquisition_->master_path);
  test::expect_same_acquisition(back, *acquisition_);
}

TEST_F(InspectorWire, MaskEdgesRoundTrip) {
  catalog::Acquisition a = *acquisition_;
  for (const auto& pattern : {std::vector<std::uint8_t>(192, 1), std::vector<std::uint8_t>(192, 0)}) {
    a.pixel_mask = pattern;
    a.pixel_mask.front() = 1;  // starts masked: the first unmasked run is empty
    a.masked_pixel_count = 0;
    for (auto pixel : a.pixel_mask) a.masked_pixel_count += pixel;
    const auto back = acquisition_from_json(acquisition_to_json(a));
    EXPECT_EQ(back.pixel_mask, a.pixel_mask);
  }
  a.pixel_mask.clear();
  a.masked_pixel_count = 0;
  EXPECT_TRUE(acquisition_from_json(acquisition_to_json(a)).pixel_mask.empty());
}

TEST_F(InspectorWire, HostileRepliesAreRefused) {
  for (const std::string line : {"", "garbage", "[]", "{}", "null", R"({"acquisition":1})", R"({"acquisition":{}})",
                                 R"({"acquisition":[],"extra":1})"}) {
    SCOPED_TRACE(line);
    EXPECT_THROW((void)parse_reply(line, acquisition_->master_path), Error);
  }
  auto with = [](const char* key, const json& value) {
    json reply = good();
    reply["acquisition"][key] = value;
    return reply;
  };
  expect_refused(with("master_path", "/elsewhere_master.h5"), "another master");
  expect_refused(with("scan_rows", -1), "negative count");
  expect_refused(with("scan_rows", 1.5), "fractional count");
  expect_refused(with("scan_rows", "3"), "count as text");
  expect_refused(with("scan_rows", 4), "scan shape does not cover the stored frames");
  expect_refused(with("detector_rows", std::uint64_t{1} << 40), "mask does not cover the detector");
  expect_refused(with("dtype", "float64"), "unknown dtype");
  expect_refused(with("chunk_filter", "zstd"), "unknown filter");
  expect_refused(with("chunk_element_size", 4), "element size differs from dtype");
  expect_refused(with("masked_pixel_count", 8), "masked count differs from mask");
  expect_refused(with("pixel_mask_runs", json::array({1u << 30})), "runs past the detector");
  expect_refused(with("pixel_mask_runs", json::array({10})), "runs that do not cover the detector");
  expect_refused(with("pixel_mask_runs", json::array()), "empty runs");
  expect_refused(with("stored_frames", 11), "stored frames differ from the shards");
  expect_refused(with("reason", std::string("a\0b", 3)), "NUL in text");
  expect_refused(with("reason", std::string(1 << 17, 'x')), "overlong text");
  expect_refused(with("shards", json::array()), "loadable without shards");
  json relative = good();
  relative["acquisition"]["shards"][0]["file_path"] = "relative.h5";
  expect_refused(relative, "relative shard path");
  json missing = good();
  missing["acquisition"].erase("signature");
  expect_refused(missing, "missing member");
  json bad_signature = good();
  bad_signature["acquisition"]["signature"][0]["inode"] = -4;
  expect_refused(bad_signature, "negative inode");
  json too_many = good();
  too_many["acquisition"]["shards"][0]["frame_count"] = std::uint64_t{1} << 63;
  expect_refused(too_many, "shard frames overflow");
}

TEST_F(InspectorWire, WorkerErrorIsInternal) {
  try {
    (void)parse_reply(R"({"error":"expected {\"inspect\": PATH}"})", acquisition_->master_path);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::internal);
  }
}

TEST_F(InspectorWire, StorageRoundTripAndHostileStorageReplies) {
  const auto& shard = acquisition_->shards.front();
  const catalog::ShardStorage storage = catalog::read_shard_storage(shard.file_path, shard.dataset_path);
  ASSERT_EQ(storage.layout, catalog::ShardLayout::chunked);
  const json good_reply = {{"storage", shard_storage_to_json(storage)}};
  const catalog::ShardStorage back = parse_storage_reply(good_reply.dump());
  EXPECT_EQ(shard_storage_to_json(back), shard_storage_to_json(storage));
  EXPECT_EQ(back.dims, storage.dims);
  EXPECT_EQ(back.object_header_address, storage.object_header_address);

  auto refused = [](const json& reply, const std::string& why) {
    SCOPED_TRACE(why);
    EXPECT_THROW((void)parse_storage_reply(reply.dump()), ProtocolError);
  };
  auto with = [&](const char* key, const json& value) {
    json reply = good_reply;
    reply["storage"][key] = value;
    return reply;
  };
  refused(with("max_dims", json::array({1, 2})), "rank mismatch");
  refused(with("offset_size", 3), "odd address size");
  refused(with("layout", "virtual"), "unknown layout");
  refused(with("dims", json::array({-1, 8, 8})), "negative extent");
  refused(with("chunks", json::array({json::array({json::array({0, 0, 0}), 1, 1, 0})})), "chunks without chunks_listed");
  json listed = with("chunks_listed", true);
  listed["storage"]["chunks"] = json::array({json::array({json::array({0, 0}), 1, 1, 0})});
  refused(listed, "chunk offsets of another rank");
  listed["storage"]["chunks"] = json::array({json::array({json::array({0, 0, 0}), 1, 1, std::uint64_t{1} << 33})});
  refused(listed, "filter mask beyond 32 bits");
  refused(json({{"failed", {{"kind", "unavailable"}, {"message", "x"}}}}), "a kind the worker may not report");
  try {
    (void)parse_storage_reply(json({{"failed", {{"kind", "io"}, {"message", "cannot open"}}}}).dump());
    ADD_FAILURE() << "accepted";
  } catch (const ProtocolError&) {
    ADD_FAILURE() << "a typed answer taken for a protocol violation";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::io);
    EXPECT_STREQ(e.what(), "cannot open");
  }
}

TEST_F(InspectorWire, MetadataRoundTripAndHostileMetadataReplies) {
  const catalog::MasterMetadata metadata = catalog::read_master_metadata(dir_->file("wire_master.h5"));
  const std::string path = metadata.master_path;
  const std::string line = json({{"metadata", master_metadata_to_json(metadata)}}).dump();
  const catalog::MasterMetadata parsed = parse_metadata_reply(line, path);
  EXPECT_EQ(parsed.fields, metadata.fields);
  EXPECT_EQ(parsed.entries, metadata.entries);
  EXPECT_EQ(parsed.sidecar_name, "wire.h5");
  EXPECT_FALSE(parsed.fields.empty());

  auto refused = [&](const std::function<void(json&)>& spoil, const char* what) {
    json document = master_metadata_to_json(metadata);
    spoil(document);
    try {
      (void)parse_metadata_reply(json({{"metadata", document}}).dump(), path);
      ADD_FAILURE() << "accepted " << what;
    } catch (const ProtocolError&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": not a protocol error: " << e.what();
    }
  };
  refused([](json& d) { d["master_path"] = "/elsewhere_master.h5"; }, "another master");
  refused([](json& d) { d["fields"][0]["name"] = "no_such_field"; }, "an unknown field");
  refused([](json& d) { d["fields"][0]["unit"] = "furlong"; }, "a field in another unit");
  refused([](json& d) { d["fields"][0]["value"] = -1.0; }, "a negative high tension");
  refused([](json& d) { d["fields"].push_back(d["fields"][0]); }, "a field twice");
  refused([](json& d) { d["entries"][0]["value"] = std::string(catalog::kMaxMetadataTextBytes + 1, 'x'); },
          "a text over the limit");
  refused([](json& d) { d["entries"][0]["value"] = json::array({1, 2}); }, "an array value");
  refused([](json& d) { d["entries"][0]["value"] = std::uint64_t{1} << 63; }, "an integer out of range");
  refused([](json& d) { d["sidecar"] = "../x.h5"; }, "a sidecar with a folder");
  refused([](json& d) {
    for (int i = 0; i < 900; ++i) d["entries"].push_back(d["entries"][0]);
  }, "too many entries");
  refused([](json& d) { d.erase("entries_truncated"); }, "a missing member");
  try {
    (void)parse_metadata_reply(R"({"failed": {"kind": "not_found", "message": "gone"}})", path);
    ADD_FAILURE() << "no error";
  } catch (const ProtocolError& e) {
    ADD_FAILURE() << e.what();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::not_found);
  }
  EXPECT_THROW((void)parse_metadata_reply(R"({"failed": {"kind": "internal", "message": "x"}})", path), ProtocolError);
}

}  // namespace
}  // namespace quantem::inspector
