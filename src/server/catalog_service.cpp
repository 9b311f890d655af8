#include "quantem/server/catalog_service.hpp"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "quantem/core/error.hpp"
#include "quantem/protocol/documents.hpp"

namespace quantem::server {

CatalogService::CatalogService(std::string data_folder, CatalogServiceOptions options)
    : data_folder_(std::move(data_folder)), options_(options) {}

CatalogService::~CatalogService() {
  std::thread walker;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    walker = std::move(walker_);
  }
  if (walker.joinable()) walker.join();
}

bool CatalogService::built() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return catalog_ != nullptr;
}

std::uint64_t CatalogService::callers_waiting_for_build() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiting_;
}

std::uint64_t CatalogService::builds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return builds_;
}

void CatalogService::set_masters_locked(std::vector<std::string> masters) {
  masters_ = std::move(masters);
  walked_ = true;
  last_walk_ = std::chrono::steady_clock::now();
  // Forget inspections of masters that disappeared.
  for (auto it = inspections_.begin(); it != inspections_.end();) {
    if (std::find(masters_.begin(), masters_.end(), it->first) == masters_.end()) {
      it = inspections_.erase(it);
    } else {
      ++it;
    }
  }
}

std::shared_ptr<const catalog::Catalog> CatalogService::catalog(bool refresh) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!refresh && catalog_) return catalog_;
  if (building_) {
    // Coalesce: wait for the running build and share its result.
    const std::uint64_t attempt = build_attempts_;
    ++waiting_;
    const bool finished = build_done_.wait_for(lock, options_.rebuild_wait_limit, [&] { return build_attempts_ != attempt; });
    --waiting_;
    if (!finished) {
      throw unavailable("the catalog of " + data_folder_ + " is still being built; retry shortly");
    }
    if (catalog_) return catalog_;
    throw Error(ErrorKind::io, "building the catalog failed: " + build_error_.value_or("unknown error"));
  }
  building_ = true;
  lock.unlock();

  std::shared_ptr<const catalog::Catalog> built;
  std::vector<std::string> masters;
  std::optional<std::string> error;
  try {
    const auto started = std::chrono::steady_clock::now();
    built = std::make_shared<const catalog::Catalog>(options_.build(data_folder_));
    masters = catalog::discover_masters(data_folder_);
    std::size_t files = 0;
    for (const auto& session : built->sessions) files += session.files.size();
    spdlog::info("catalog of {}: {} sessions, {} masters in {:.3f} s", data_folder_, built->sessions.size(), files,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  } catch (const std::exception& e) {
    error = e.what();
    spdlog::error("building the catalog of {} failed: {}", data_folder_, e.what());
  }

  lock.lock();
  building_ = false;
  ++build_attempts_;
  if (built) {
    catalog_ = built;
    ++builds_;
    build_error_.reset();
    last_build_ = std::chrono::steady_clock::now();
    fresh_.clear();
    set_masters_locked(std::move(masters));
    for (const auto& session : built->sessions)
      for (const auto& acquisition : session.files) inspections_[acquisition.master_path] = acquisition;
  } else {
    build_error_ = error;
    last_build_ = std::chrono::steady_clock::now();
  }
  build_done_.notify_all();
  if (!built) {
    if (catalog_) return catalog_;  // keep serving the previous catalog
    throw Error(ErrorKind::io, "building the catalog failed: " + error.value_or("unknown error"));
  }
  return catalog_;
}

nlohmann::ordered_json CatalogService::sessions_document(bool refresh) {
  return catalog::sessions_document(*catalog(refresh));
}

std::shared_ptr<const catalog::Catalog> CatalogService::rebuild_for_unknown_name() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const bool recent = std::chrono::steady_clock::now() - last_build_ < options_.unknown_name_rebuild_interval;
    if (recent && !building_ && catalog_) return catalog_;
  }
  return catalog(true);
}

catalog::Acquisition CatalogService::resolve(const std::string& session_id, const std::string& file) {
  if (file.empty() || file == "." || file.find('/') != std::string::npos || file.find('\0') != std::string::npos) {
    throw bad_request("file must be one master filename");
  }
  auto current = catalog(false);
  const catalog::Session* session = current->find_session(session_id);
  if (!session) {
    current = rebuild_for_unknown_name();
    session = current->find_session(session_id);
    if (!session) throw not_found("unknown session: " + session_id);
  }
  auto find_file = [&](const catalog::Session& s) -> const catalog::Acquisition* {
    for (const auto& acquisition : s.files)
      if (acquisition.name == file) return &acquisition;
    return nullptr;
  };
  const catalog::Acquisition* found = find_file(*session);
  if (!found) {
    current = rebuild_for_unknown_name();
    session = current->find_session(session_id);
    found = session ? find_file(*session) : nullptr;
    if (!found) throw not_found("master not found: " + file);
  }

  catalog::Acquisition acquisition = *found;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto fresh = fresh_.find(acquisition.master_path);
    if (fresh != fresh_.end()) acquisition = fresh->second;
  }
  if (catalog::restat_signature(acquisition.signature) != acquisition.signature) {
    spdlog::info("{} changed since its inspection; inspecting it again", acquisition.master_path);
    acquisition = catalog::inspect_master(acquisition.master_path);
    std::lock_guard<std::mutex> lock(mutex_);
    fresh_[acquisition.master_path] = acquisition;
  }
  return acquisition;
}

void CatalogService::background_walk() {
  std::vector<std::string> masters;
  bool ok = true;
  try {
    masters = catalog::discover_masters(data_folder_);
  } catch (const std::exception& e) {
    ok = false;
    spdlog::warn("background discovery of {} failed: {}", data_folder_, e.what());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  walk_in_flight_ = false;
  if (ok) {
    set_masters_locked(std::move(masters));
  } else {
    last_walk_ = std::chrono::steady_clock::now();  // wait a full interval before retrying
  }
}

nlohmann::ordered_json CatalogService::acquisitions_document() {
  std::vector<std::string> masters;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!walked_) {
      lock.unlock();
      auto walked = catalog::discover_masters(data_folder_);
      lock.lock();
      if (!walked_) set_masters_locked(std::move(walked));
    } else if (!walk_in_flight_ && !stopping_ &&
               std::chrono::steady_clock::now() - last_walk_ >= options_.rewalk_interval) {
      walk_in_flight_ = true;
      if (walker_.joinable()) walker_.join();  // the previous walk has finished (not in flight)
      walker_ = std::thread([this] { background_walk(); });
    }
    masters = masters_;
  }

  std::vector<catalog::Acquisition> inspections;
  inspections.reserve(masters.size());
  for (const auto& path : masters) {
    std::optional<catalog::Acquisition> cached;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = inspections_.find(path);
      if (it != inspections_.end()) cached = it->second;
    }
    if (!cached || catalog::restat_signature(cached->signature) != cached->signature) {
      cached = catalog::inspect_master(path);
      std::lock_guard<std::mutex> lock(mutex_);
      inspections_[path] = *cached;
    }
    inspections.push_back(std::move(*cached));
  }
  return protocol::acquisitions_document(inspections);
}

}  // namespace quantem::server
