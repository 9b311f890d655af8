// Discovery, sessions and the sessions document: docs/protocol.md, 'Masters, sessions and readiness'.
#include "quantem/catalog/catalog.hpp"

#include <dirent.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <set>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "quantem/core/error.hpp"
#include "quantem/core/text.hpp"

namespace quantem::catalog {

namespace {

constexpr const char* kMasterSuffix = "_master.h5";

std::vector<std::string> split_components(const std::string& relative) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= relative.size()) {
    auto slash = relative.find('/', start);
    if (slash == std::string::npos) slash = relative.size();
    if (slash > start) parts.push_back(relative.substr(start, slash - start));
    start = slash + 1;
  }
  return parts;
}

bool is_master_name(const std::string& name) {
  const std::string suffix = kMasterSuffix;
  return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Strict UTF-8 validation (no overlongs, no surrogates, at most U+10FFFF).
bool is_valid_utf8(const std::string& text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    const unsigned char c = *p;
    std::size_t length = 0;
    std::uint32_t code = 0;
    if (c < 0x80) {
      ++p;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      length = 2;
      code = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      length = 3;
      code = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      length = 4;
      code = c & 0x07;
    } else {
      return false;
    }
    if (static_cast<std::size_t>(end - p) < length) return false;
    for (std::size_t i = 1; i < length; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      code = (code << 6) | (p[i] & 0x3F);
    }
    if ((length == 2 && code < 0x80) || (length == 3 && code < 0x800) || (length == 4 && code < 0x10000) ||
        code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) {
      return false;
    }
    p += length;
  }
  return true;
}

// Replaces every invalid byte with U+FFFD.
std::string repaired_utf8(const std::string& text) {
  if (is_valid_utf8(text)) return text;
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    bool matched = false;
    for (std::size_t length = 1; length <= 4 && i + length <= text.size(); ++length) {
      const std::string piece = text.substr(i, length);
      if (is_valid_utf8(piece)) {
        out += piece;
        i += length;
        matched = true;
        break;
      }
    }
    if (!matched) {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

std::string relative_to(const std::string& root, const std::string& path) {
  if (path == root) return "";
  const std::string prefix = root == "/" ? "/" : root + "/";
  return path.compare(0, prefix.size(), prefix) == 0 ? path.substr(prefix.size()) : path;
}

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return "";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// Python's Path.name of an absolute path: "" for "/".
std::string path_name(const std::string& absolute) { return absolute == "/" ? "" : base_name(absolute); }

// (source, date) from the relative directory parts, as the reference derives them.
std::pair<std::string, std::string> source_and_date(const std::string& root, const std::vector<std::string>& parts) {
  if (parts.size() >= 2) return {parts[parts.size() - 2], parts.back()};
  if (parts.size() == 1) return {path_name(root), parts[0]};
  return {path_name(parent_of(root)), path_name(root)};
}

nlohmann::ordered_json optional_number(const std::optional<double>& value) {
  if (value && std::isfinite(*value)) return *value;
  return nullptr;
}

}  // namespace

const Session* Catalog::find_session(const std::string& id) const {
  const auto found = session_directories.find(id);
  if (found == session_directories.end()) return nullptr;
  for (const auto& session : sessions) {
    if (session.directory == found->second) return &session;
  }
  return nullptr;
}

std::string absolute_folder(const std::string& folder) {
  std::string expanded = folder;
  if (!expanded.empty() && expanded[0] == '~') {
    const auto slash = expanded.find('/');
    const std::string user = expanded.substr(1, slash == std::string::npos ? std::string::npos : slash - 1);
    std::string home;
    if (user.empty()) {
      if (const char* env = std::getenv("HOME")) home = env;
      if (home.empty()) {
        if (const passwd* entry = getpwuid(getuid())) home = entry->pw_dir;
      }
    } else if (const passwd* entry = getpwnam(user.c_str())) {
      home = entry->pw_dir;
    }
    if (!home.empty()) expanded = home + (slash == std::string::npos ? "" : expanded.substr(slash));
  }
  return lexically_absolute(expanded.empty() ? "." : expanded);
}

namespace {

using FoundMaster = std::pair<std::vector<std::string>, std::string>;  // (components, absolute path)

// One directory level; an unreadable directory is skipped with a warning, its
// siblings are still walked. Symlinked directories are not descended into.
// Plain readdir() with the entries' d_type: a folder of tens of thousands of
// session folders is walked at every start and refresh.
// `subdirectories` receives the directories to walk next.
void list_level(const std::string& root, const std::string& directory, std::vector<FoundMaster>& found,
                std::vector<UnreadableDirectory>* unreadable, std::vector<std::string>& subdirectories) {
  DIR* handle = ::opendir(directory.c_str());
  if (!handle) {
    const std::string reason = std::strerror(errno);
    if (unreadable) {
      unreadable->push_back({directory, reason});  // the caller reports it (once)
    } else {
      spdlog::warn("catalog: cannot list {}: {}", directory, reason);
    }
    return;
  }
  const std::string prefix = directory == "/" ? "/" : directory + "/";
  while (true) {
    errno = 0;
    const dirent* entry = ::readdir(handle);
    if (!entry) {
      if (errno != 0) spdlog::warn("catalog: listing {}: {}", directory, std::strerror(errno));
      break;
    }
    const char* name = entry->d_name;
    if (name[0] == '.' || name[0] == '_') continue;  // hidden (and ".", ".."), as the reference skips them
    std::string path = prefix + name;
    bool is_directory = entry->d_type == DT_DIR;
    if (entry->d_type == DT_UNKNOWN) {  // some filesystems do not fill d_type
      struct stat info {};
      is_directory = ::lstat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode);
    }
    if (is_master_name(name)) {  // a directory named *_master.h5 is listed, as rglob does
      const std::string relative = relative_to(root, path);
      if (!is_valid_utf8(relative)) {
        spdlog::warn("catalog: skipping a master whose path is not valid UTF-8: {}", repaired_utf8(path));
      } else {
        found.emplace_back(split_components(relative), path);
      }
    }
    if (is_directory) subdirectories.push_back(std::move(path));
  }
  ::closedir(handle);
}

void walk_directory(const std::string& root, const std::string& directory, std::vector<FoundMaster>& found,
                    std::vector<UnreadableDirectory>* unreadable) {
  std::vector<std::string> subdirectories;
  list_level(root, directory, found, unreadable, subdirectories);
  for (const auto& subdirectory : subdirectories) walk_directory(root, subdirectory, found, unreadable);
}

// The walk of the data folder's subdirectories spread over `threads` threads;
// the results are joined in the order one thread would have found them.
void walk_in_parallel(const std::string& root, std::vector<FoundMaster>& found,
                      std::vector<UnreadableDirectory>* unreadable, std::size_t threads) {
  std::vector<std::string> subdirectories;
  list_level(root, root, found, unreadable, subdirectories);
  struct Part {
    std::vector<FoundMaster> found;
    std::vector<UnreadableDirectory> unreadable;
  };
  std::vector<Part> parts(subdirectories.size());
  auto walk_share = [&](std::size_t first) {
    for (std::size_t i = first; i < subdirectories.size(); i += threads) {
      walk_directory(root, subdirectories[i], parts[i].found, unreadable ? &parts[i].unreadable : nullptr);
    }
  };
  std::vector<std::thread> walkers;
  for (std::size_t t = 1; t < threads; ++t) walkers.emplace_back(walk_share, t);
  walk_share(0);
  for (auto& walker : walkers) walker.join();
  for (auto& part : parts) {
    found.insert(found.end(), std::make_move_iterator(part.found.begin()), std::make_move_iterator(part.found.end()));
    if (unreadable) unreadable->insert(unreadable->end(), part.unreadable.begin(), part.unreadable.end());
  }
}

}  // namespace

std::vector<std::string> discover_masters(const std::string& data_folder) { return discover_masters(data_folder, nullptr); }

std::vector<std::string> discover_masters(const std::string& data_folder, std::vector<UnreadableDirectory>* unreadable,
                                          std::size_t threads) {
  const std::string root = absolute_folder(data_folder);
  std::vector<FoundMaster> found;
  if (threads <= 1) {
    walk_directory(root, root, found, unreadable);
  } else {
    walk_in_parallel(root, found, unreadable, threads);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> masters;
  masters.reserve(found.size());
  for (auto& entry : found) masters.push_back(std::move(entry.second));
  return masters;
}

namespace {

// Sessions from the inspected masters (results[i] belongs to masters[i]; a
// master without a result is left out).
// With `take`, the results are moved out instead of copied (the final assembly).
Catalog assemble_catalog(const std::string& root, const std::vector<std::string>& masters,
                         std::vector<std::optional<Acquisition>>& results, const std::vector<char>* done,
                         bool take = false) {
  Catalog catalog;
  catalog.data_folder = root;
  std::map<std::string, Session> by_path;
  for (std::size_t i = 0; i < masters.size(); ++i) {
    if (done && !(*done)[i]) continue;
    if (!results[i]) continue;
    const std::string& master = masters[i];
    const std::string directory = parent_of(master);
    const std::string relative_directory = relative_to(root, directory);
    const std::string session_path = relative_directory.empty() ? "." : relative_directory;
    auto [entry, inserted] = by_path.try_emplace(session_path);
    Session& session = entry->second;
    if (inserted) {
      session.path = session_path;
      session.directory = directory;
      std::tie(session.source, session.date) = source_and_date(root, split_components(relative_directory));
    }
    if (take) {
      session.files.push_back(std::move(*results[i]));
    } else {
      session.files.push_back(*results[i]);
    }
  }
  // std::map orders by plain string order of path, as the reference does.
  for (auto& [path, session] : by_path) {
    std::sort(session.files.begin(), session.files.end(),
              [](const Acquisition& a, const Acquisition& b) { return a.name < b.name; });
    catalog.session_directories[path] = session.directory;
    catalog.sessions.push_back(std::move(session));
  }
  // Legacy aliases "{source}/{date}": only when unambiguous and not a real path.
  std::map<std::string, std::set<std::string>> alias_directories;
  for (const auto& session : catalog.sessions) {
    alias_directories[session.source + "/" + session.date].insert(session.directory);
  }
  for (const auto& [alias, directories] : alias_directories) {
    if (directories.size() == 1) catalog.session_directories.emplace(alias, *directories.begin());
  }
  return catalog;
}

// One master's inspection; nullopt (with a warning) when it throws anything
// but `unavailable`, which is rethrown.
std::optional<Acquisition> inspect_or_skip(const InspectFunction& inspect, const std::string& master) {
  try {
    return inspect(master);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::unavailable) throw;
    spdlog::warn("catalog: skipping {}: {}", master, e.what());
  } catch (const std::exception& e) {
    spdlog::warn("catalog: skipping {}: {}", master, e.what());
  }
  return std::nullopt;
}

// Inspects masters[pending[*]] on `threads` threads; the caller's thread
// reports progress meanwhile.
void inspect_in_parallel(const std::string& root, const std::vector<std::string>& masters,
                         const std::vector<std::size_t>& pending, const InspectFunction& inspect,
                         const BuildOptions& options, std::vector<std::optional<Acquisition>>& results,
                         std::vector<char>& done) {
  std::mutex mutex;
  std::condition_variable finished;
  std::size_t next = 0, running = 0;
  std::exception_ptr failure;
  auto work = [&] {
    while (true) {
      std::size_t index = 0;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (failure || next == pending.size()) break;
        index = pending[next++];
      }
      std::optional<Acquisition> result;
      try {
        result = inspect_or_skip(inspect, masters[index]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!failure) failure = std::current_exception();
        break;
      }
      std::lock_guard<std::mutex> lock(mutex);
      results[index] = std::move(result);
      done[index] = 1;
    }
    std::lock_guard<std::mutex> lock(mutex);
    --running;
    finished.notify_all();
  };
  const std::size_t thread_count = std::max<std::size_t>(1, std::min(options.threads, pending.size()));
  std::vector<std::thread> threads;
  running = thread_count;
  for (std::size_t i = 0; i < thread_count; ++i) threads.emplace_back(work);
  {
    std::unique_lock<std::mutex> lock(mutex);
    auto interval = options.progress_interval;
    while (running > 0) {
      finished.wait_for(lock, interval, [&] { return running == 0; });
      if (running == 0 || !options.progress) continue;
      if (options.progress_wanted && !options.progress_wanted()) continue;
      const auto started = std::chrono::steady_clock::now();
      const Catalog partial = assemble_catalog(root, masters, results, &done);
      // The snapshot copies what is known under the lock the inspecting
      // threads take: wait at least ten times its cost before the next one.
      interval = std::max(options.progress_interval, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                         10 * (std::chrono::steady_clock::now() - started)));
      lock.unlock();
      try {
        options.progress(partial);
      } catch (const std::exception& e) {
        spdlog::warn("catalog: a progress listener failed: {}", e.what());
      }
      lock.lock();
    }
  }
  for (auto& thread : threads) thread.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace

namespace {

// Logs (debug) the wall and this thread's CPU seconds of each step of a build:
// where a large folder's start goes.
class PhaseTimer {
 public:
  void operator()(const char* step) {
    const auto now = std::chrono::steady_clock::now();
    const double cpu = thread_cpu_seconds();
    spdlog::debug("catalog build: {} in {:.3f} s ({:.3f} s CPU on the building thread)", step,
                  std::chrono::duration<double>(now - wall_).count(), cpu - cpu_);
    wall_ = now;
    cpu_ = cpu;
  }

 private:
  static double thread_cpu_seconds() {
    timespec now{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
    return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
  }
  std::chrono::steady_clock::time_point wall_ = std::chrono::steady_clock::now();
  double cpu_ = thread_cpu_seconds();
};

}  // namespace

Catalog build_catalog(const std::string& data_folder) { return build_catalog(data_folder, inspect_master); }

Catalog build_catalog(const std::string& data_folder, const InspectFunction& inspect) {
  return build_catalog(data_folder, inspect, BuildOptions{});
}

Catalog build_catalog(const std::string& data_folder, const InspectFunction& inspect, const BuildOptions& options,
                      BuildCounts* counts, std::vector<std::string>* masters_out,
                      std::vector<UnreadableDirectory>* unreadable) {
  const std::string root = absolute_folder(data_folder);
  PhaseTimer lap;
  const std::vector<std::string> masters = discover_masters(root, unreadable, options.threads);
  lap("walk");
  std::vector<std::optional<Acquisition>> results(masters.size());
  std::vector<char> done(masters.size(), 0);
  std::vector<std::size_t> pending;
  if (options.reuse) {
    // A few stat() calls per master: spread over the build's threads for a large folder.
    const std::size_t threads = masters.size() >= 1024 ? std::max<std::size_t>(1, options.threads) : 1;
    std::vector<std::thread> checkers;
    for (std::size_t t = 1; t < threads; ++t) {
      checkers.emplace_back([&, t] {
        for (std::size_t i = t; i < masters.size(); i += threads) results[i] = options.reuse(masters[i]);
      });
    }
    for (std::size_t i = 0; i < masters.size(); i += threads) results[i] = options.reuse(masters[i]);
    for (auto& checker : checkers) checker.join();
    lap("reuse checks");
  }
  for (std::size_t i = 0; i < masters.size(); ++i) {
    if (results[i]) {
      done[i] = 1;
    } else {
      pending.push_back(i);
    }
  }
  if (counts) *counts = BuildCounts{masters.size() - pending.size(), pending.size()};
  if (options.progress && !pending.empty()) options.progress(assemble_catalog(root, masters, results, &done));
  if (options.threads <= 1 && !options.progress) {
    for (const std::size_t index : pending) results[index] = inspect_or_skip(inspect, masters[index]);
  } else if (!pending.empty()) {
    inspect_in_parallel(root, masters, pending, inspect, options, results, done);
  }
  lap("inspections");
  Catalog catalog = assemble_catalog(root, masters, results, nullptr, /*take=*/true);
  if (masters_out) *masters_out = masters;
  lap("assembly");
  return catalog;
}

nlohmann::ordered_json sessions_document(const Catalog& catalog) {
  using json = nlohmann::ordered_json;
  json sessions = json::array();
  for (const auto& session : catalog.sessions) {
    json files = json::array();
    for (const auto& file : session.files) {
      json entry;
      entry["name"] = repaired_utf8(file.name);
      entry["shape"] = json::array({file.scan_rows, file.scan_cols, file.detector_rows, file.detector_cols});
      entry["dtype"] = file.dtype ? json(dtype_name(*file.dtype)) : json(nullptr);
      entry["cal"] = file.scan_sampling_A && std::isfinite(*file.scan_sampling_A) ? "ok" : "un";
      entry["size"] = format_size(file.size_bytes);
      entry["size_bytes"] = file.size_bytes;
      entry["loadable"] = file.status.loadable;
      json status;
      status["loadable"] = file.status.loadable;
      status["reason"] = repaired_utf8(file.status.reason);
      status["action"] = file.status.action;
      entry["load_status"] = std::move(status);
      entry["scan_sampling_A"] = optional_number(file.scan_sampling_A);
      entry["k_pixel_size_mrad"] = optional_number(file.k_pixel_size_mrad);
      entry["has_ssb"] = false;
      files.push_back(std::move(entry));
    }
    json item;
    item["path"] = repaired_utf8(session.path);
    item["source"] = repaired_utf8(session.source);
    item["date"] = repaired_utf8(session.date);
    item["files"] = std::move(files);
    sessions.push_back(std::move(item));
  }
  json document;
  document["data_folder"] = repaired_utf8(catalog.data_folder);
  document["data_folders"] = json::array({repaired_utf8(catalog.data_folder)});
  document["sessions"] = std::move(sessions);
  document["complete"] = true;
  return document;
}

namespace {

// A JSON string as dump() writes it (UTF-8 raw, invalid bytes repaired).
void append_json_string(std::string& out, const std::string& text) {
  out += nlohmann::ordered_json(repaired_utf8(text)).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

void append_optional_number(std::string& out, const std::optional<double>& value) {
  out += optional_number(value).dump();
}

}  // namespace

std::string sessions_document_text(const Catalog& catalog) {
  std::string out;
  out.reserve(256 + catalog.sessions.size() * 512);
  out += "{\"data_folder\":";
  append_json_string(out, catalog.data_folder);
  out += ",\"data_folders\":[";
  append_json_string(out, catalog.data_folder);
  out += "],\"sessions\":[";
  bool first_session = true;
  for (const auto& session : catalog.sessions) {
    out += first_session ? "{\"path\":" : ",{\"path\":";
    first_session = false;
    append_json_string(out, session.path);
    out += ",\"source\":";
    append_json_string(out, session.source);
    out += ",\"date\":";
    append_json_string(out, session.date);
    out += ",\"files\":[";
    bool first_file = true;
    for (const auto& file : session.files) {
      out += first_file ? "{\"name\":" : ",{\"name\":";
      first_file = false;
      append_json_string(out, file.name);
      out += ",\"shape\":[" + std::to_string(file.scan_rows) + "," + std::to_string(file.scan_cols) + "," +
             std::to_string(file.detector_rows) + "," + std::to_string(file.detector_cols) + "]";
      out += ",\"dtype\":";
      out += file.dtype ? "\"" + std::string(dtype_name(*file.dtype)) + "\"" : std::string("null");
      out += file.scan_sampling_A && std::isfinite(*file.scan_sampling_A) ? ",\"cal\":\"ok\"" : ",\"cal\":\"un\"";
      out += ",\"size\":";
      append_json_string(out, format_size(file.size_bytes));
      out += ",\"size_bytes\":" + std::to_string(file.size_bytes);
      const char* loadable = file.status.loadable ? "true" : "false";
      out += std::string(",\"loadable\":") + loadable + ",\"load_status\":{\"loadable\":" + loadable + ",\"reason\":";
      append_json_string(out, file.status.reason);
      out += ",\"action\":";  // not repaired first, as sessions_document() leaves it
      out += nlohmann::ordered_json(file.status.action)
                 .dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
      out += "},\"scan_sampling_A\":";
      append_optional_number(out, file.scan_sampling_A);
      out += ",\"k_pixel_size_mrad\":";
      append_optional_number(out, file.k_pixel_size_mrad);
      out += ",\"has_ssb\":false}";
    }
    out += "]}";
  }
  out += "],\"complete\":true}";
  return out;
}

std::string format_size(std::uint64_t bytes) {
  struct Unit {
    const char* name;
    std::uint64_t bytes;
  };
  static constexpr Unit kUnits[] = {{"TB", 1ull << 40}, {"GB", 1ull << 30}, {"MB", 1ull << 20}, {"KB", 1ull << 10}};
  for (const auto& unit : kUnits) {
    if (bytes >= unit.bytes) {
      // "%.1f" rounds the exact binary value half-to-even, like Python's ":.1f".
      char text[64];
      std::snprintf(text, sizeof text, "%.1f %s", static_cast<double>(bytes) / static_cast<double>(unit.bytes),
                    unit.name);
      return text;
    }
  }
  return std::to_string(bytes) + " B";
}

}  // namespace quantem::catalog
