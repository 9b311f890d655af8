#include <gtest/gtest.h>

#include "quantem/protocol/documents.hpp"

using namespace quantem::protocol;
using quantem::catalog::Acquisition;
using quantem::catalog::SignatureEntry;

namespace {

SignatureEntry entry(const std::string& path, bool exists, std::int64_t size, std::int64_t mtime_ns) {
  SignatureEntry e;
  e.path = path;
  e.exists = exists;
  e.size_bytes = size;
  e.mtime_ns = mtime_ns;
  return e;
}

Acquisition acquisition(const std::string& stem, bool ready, std::vector<SignatureEntry> signature) {
  Acquisition a;
  a.stem = stem;
  a.name = stem + "_master.h5";
  a.master_path = "/data/" + a.name;
  a.status.loadable = ready;
  a.signature = std::move(signature);
  return a;
}

}  // namespace

TEST(Documents, IsoTimestampsFollowPythonIsoformat) {
  EXPECT_EQ(iso_utc_from_ns(0), "1970-01-01T00:00:00+00:00");
  EXPECT_EQ(iso_utc_from_ns(1755245527479486000LL), "2025-08-15T08:12:07.479486+00:00");
  EXPECT_EQ(iso_utc_from_ns(1755245527000000000LL), "2025-08-15T08:12:07+00:00");
}

TEST(Documents, AcquisitionEventCountsLinkedFiles) {
  const auto a = acquisition("linked", true,
                             {entry("/data/linked_master.h5", true, 100, 5), entry("/data/linked_data_000001.h5", true, 900, 7),
                              entry("/data/linked_data_000002.h5", false, 0, 0)});
  const auto event = acquisition_event(a);
  EXPECT_EQ(event.dump(),
            R"({"kind":"ready","path":"/data/linked_master.h5","stem":"linked","chunks_seen":1,"chunks_expected":2,)"
            R"("bytes_total":1000,"ts":"1970-01-01T00:00:00+00:00"})");
}

TEST(Documents, AcquisitionsSplitPendingAndHistoryWithAStableToken) {
  const auto ready = acquisition("a", true, {entry("/data/a_master.h5", true, 10, 20)});
  const auto writing = acquisition("b", false, {entry("/data/b_master.h5", true, 10, 20), entry("/data/b_data.h5", false, 0, 0)});
  const auto doc = acquisitions_document({ready, writing});
  EXPECT_EQ(doc["enabled"], true);
  EXPECT_EQ(doc["in_flight"].size(), 0u);
  ASSERT_EQ(doc["pending"].size(), 1u);
  EXPECT_EQ(doc["pending"][0]["kind"], "writing");
  ASSERT_EQ(doc["history"].size(), 1u);
  EXPECT_EQ(doc["history"][0]["stem"], "a");
  const std::string token = doc["ready_token"];
  EXPECT_EQ(token.size(), 24u);
  EXPECT_EQ(token.find_first_not_of("0123456789abcdef"), std::string::npos);

  // Deterministic; unaffected by pending masters; changes with a ready master's signature.
  EXPECT_EQ(acquisitions_document({ready})["ready_token"], token);
  auto touched = ready;
  touched.signature[0].mtime_ns += 1;
  EXPECT_NE(acquisitions_document({touched, writing})["ready_token"], token);
  EXPECT_NE(acquisitions_document({})["ready_token"], token);
  auto now_ready = writing;
  now_ready.status.loadable = true;
  EXPECT_NE(acquisitions_document({ready, now_ready})["ready_token"], token);
}

TEST(Documents, CapabilitiesHaveTheReferenceFieldsAndOrder) {
  CapabilitiesInput input;
  input.backend = "cpu";
  input.implementation_revision = "rev123";
  input.data_folder = "/data";
  DeviceCapacity first;
  first.index = 0;
  first.name = "CPU virtual device 0";
  first.total_memory_bytes = 1000;
  first.cache_budget_bytes = 800;
  first.resident_bytes = 50;
  first.resident_entries = 2;
  first.active_resident_bytes = 30;
  first.evictable_bytes = 20;
  first.available_peak_bytes = 800;
  first.available_resident_bytes = 770;
  DeviceCapacity second = first;
  second.index = 1;
  second.name = "CPU virtual device 1";
  second.cache_budget_bytes = 600;
  second.total_memory_bytes = 2000;
  input.devices = {first, second};
  const auto doc = capabilities_document(input);
  std::vector<std::string> keys;
  for (auto it = doc.begin(); it != doc.end(); ++it) keys.push_back(it.key());
  const std::vector<std::string> expected = {"protocol", "protocol_version", "backend", "device_name", "device_error",
                                             "browse_gpu", "browse_gpus", "cache_fraction", "cache_budget_bytes",
                                             "aggregate_cache_budget_bytes", "largest_device_memory_bytes", "devices",
                                             "data_folders", "features", "implementation_revision"};
  EXPECT_EQ(keys, expected);
  EXPECT_EQ(doc["protocol"], "quantem-gpu-browse");
  EXPECT_EQ(doc["protocol_version"], 1);
  EXPECT_EQ(doc["backend"], "cpu");
  EXPECT_EQ(doc["device_name"], "CPU virtual device 0");
  EXPECT_TRUE(doc["browse_gpu"].is_null());  // a CPU backend browses on no GPU, as in the replaced service
  EXPECT_EQ(doc["browse_gpus"].dump(), "[0,1]");
  EXPECT_EQ(doc["cache_budget_bytes"], 800);
  EXPECT_EQ(doc["aggregate_cache_budget_bytes"], 1400);
  EXPECT_EQ(doc["largest_device_memory_bytes"], 2000);
  EXPECT_EQ(doc["data_folders"].dump(), R"(["/data"])");
  EXPECT_EQ(doc["features"]["multi_gpu_residency"], true);
  EXPECT_EQ(doc["features"]["exact_integer_images"], true);
  EXPECT_EQ(doc["features"]["ssb"]["ready"], false);
  EXPECT_FALSE(doc["features"].contains("maped"));
  EXPECT_EQ(doc["implementation_revision"], "rev123");
  EXPECT_EQ(doc["devices"][0].dump(),
            R"({"index":0,"name":"CPU virtual device 0","total_memory_bytes":1000,"cache_budget_bytes":800,"free_bytes":null,)"
            R"("resident_bytes":50,"resident_entries":2,"active_resident_bytes":30,"evictable_bytes":20,)"
            R"("available_peak_bytes":800,"available_resident_bytes":770})");
  EXPECT_NE(doc.dump().find("\"cache_fraction\":0.8,"), std::string::npos);
}

// browse_gpu names a GPU only on the CUDA backend (the replaced service's
// null for anything else); browse_gpus lists every device either way.
TEST(Documents, BrowseGpuIsTheFirstCudaDeviceAndNullOtherwise) {
  CapabilitiesInput input;
  input.implementation_revision = "rev";
  input.data_folder = "/data";
  DeviceCapacity device;
  device.index = 3;
  device.name = "GPU 3";
  device.cache_budget_bytes = 100;
  input.devices = {device};
  input.backend = "cuda";
  const auto cuda = capabilities_document(input);
  EXPECT_EQ(cuda["browse_gpu"], 3);
  input.backend = "cpu";
  const auto cpu = capabilities_document(input);
  EXPECT_TRUE(cpu["browse_gpu"].is_null());
  EXPECT_EQ(cpu["browse_gpus"].dump(), "[3]");
  input.backend = "cuda";
  input.devices.clear();
  EXPECT_TRUE(capabilities_document(input)["browse_gpu"].is_null());
}

TEST(Documents, ProvenanceIsCompactAsciiJson) {
  Provenance p;
  p.session = "s\xC3\xA9";
  p.file = "f_master.h5";
  p.signature = "abc";
  p.source_scan_rows = 5;
  p.source_scan_cols = 6;
  p.source_detector_rows = 7;
  p.source_detector_cols = 9;
  p.source_dtype = "uint16";
  p.resident_encoding = "dense-u16";
  p.output_rows = 3;
  p.output_cols = 2;
  p.output_dtype = "<u4";
  p.scan_region = {0, 5, 1, 6};
  p.scan_bin = 2;
  p.detector_bin = 1;
  p.geometry["outer_radius_px"] = 2.5;
  p.geometry["center_row"] = std::numeric_limits<double>::quiet_NaN();
  p.masked_pixel_count = 4;
  p.backend = "cpu";
  p.device_index = 1;
  p.implementation_revision = "rev";
  const std::string header = provenance_header(p);
  EXPECT_EQ(header,
            R"({"session":"s\u00e9","file":"f_master.h5","signature":"abc","source_scan_shape":[5,6],)"
            R"("source_detector_shape":[7,9],"source_dtype":"uint16","resident_encoding":"dense-u16",)"
            R"("output_shape":[3,2],"output_dtype":"<u4","scan_region":{"row_start":0,"row_stop":5,"column_start":1,"column_stop":6},)"
            R"("scan_bin":2,"detector_bin":1,"geometry":{"outer_radius_px":2.5,"center_row":null},"masked_pixel_count":4,)"
            R"("backend":"cpu","device_index":1,"implementation_revision":"rev"})");
}

TEST(Documents, DigestsAreStableAndSensitive) {
  EXPECT_EQ(digest_hex24("abc"), digest_hex24("abc"));
  EXPECT_NE(digest_hex24("abc"), digest_hex24("abd"));
  EXPECT_EQ(digest_hex24("").size(), 24u);
  quantem::catalog::SourceSignature signature = {entry("/a", true, 1, 2)};
  const auto before = signature_digest(signature);
  signature[0].size_bytes = 3;
  EXPECT_NE(signature_digest(signature), before);
}
