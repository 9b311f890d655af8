#pragma once
// The daemon's view of the data folder (reference §2, §4.2-§4.4.1):
//  - the catalog, built on first use and cached; `refresh` rebuilds it and
//    concurrent rebuilds are coalesced (a caller that waited for a running
//    rebuild gets its result);
//  - the acquisitions poll: the remembered master list returned at once, a
//    background re-walk when the last walk is older than the re-walk interval,
//    and inspections reused until a file of their signature changes;
//  - resolution of (session, file) to a fresh inspection: only catalogued
//    masters, no path escapes, an unknown name triggers at most one
//    (coalesced) rebuild per interval, and a master whose files changed since
//    its inspection is inspected again before it is used.
// Thread-safe. Waits for a running rebuild are bounded.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "quantem/catalog/catalog.hpp"

namespace quantem::server {

struct CatalogServiceOptions {
  std::chrono::milliseconds rewalk_interval{std::chrono::seconds(10)};
  // How a catalog is built (tests substitute a builder they can hold).
  std::function<catalog::Catalog(const std::string&)> build = catalog::build_catalog;
  std::chrono::milliseconds unknown_name_rebuild_interval{std::chrono::seconds(5)};
  std::chrono::milliseconds rebuild_wait_limit{std::chrono::minutes(10)};
};

class CatalogService {
 public:
  explicit CatalogService(std::string data_folder, CatalogServiceOptions options = {});
  ~CatalogService();
  CatalogService(const CatalogService&) = delete;
  CatalogService& operator=(const CatalogService&) = delete;

  const std::string& data_folder() const { return data_folder_; }

  // The cached catalog; built when absent or when refresh is true.
  std::shared_ptr<const catalog::Catalog> catalog(bool refresh);
  bool built() const;
  std::uint64_t builds() const;  // completed builds (tests and metrics)
  std::uint64_t callers_waiting_for_build() const;  // callers sharing a running build

  nlohmann::ordered_json sessions_document(bool refresh);
  nlohmann::ordered_json acquisitions_document();

  // (session, file) -> the master's current inspection. Throws quantem::Error:
  //   bad_request "file must be one master filename"
  //   not_found   "unknown session: <session>" / "master not found: <file>"
  catalog::Acquisition resolve(const std::string& session, const std::string& file);

 private:
  std::shared_ptr<const catalog::Catalog> rebuild_for_unknown_name();
  void set_masters_locked(std::vector<std::string> masters);
  void background_walk();

  const std::string data_folder_;
  const CatalogServiceOptions options_;

  mutable std::mutex mutex_;
  std::condition_variable build_done_;
  std::shared_ptr<const catalog::Catalog> catalog_;
  bool building_ = false;
  std::uint64_t builds_ = 0;
  std::uint64_t build_attempts_ = 0;
  std::uint64_t waiting_ = 0;
  std::optional<std::string> build_error_;
  std::chrono::steady_clock::time_point last_build_{};
  std::map<std::string, catalog::Acquisition> fresh_;  // re-inspections since the last build

  // Acquisitions poll.
  std::vector<std::string> masters_;
  bool walked_ = false;
  bool walk_in_flight_ = false;
  std::chrono::steady_clock::time_point last_walk_{};
  std::map<std::string, catalog::Acquisition> inspections_;
  std::thread walker_;
  bool stopping_ = false;
};

}  // namespace quantem::server
