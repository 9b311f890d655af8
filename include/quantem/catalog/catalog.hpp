#pragma once
// The catalog of a data folder: sessions (directories that directly contain
// masters) and their acquisitions, with the reference's discovery, exclusion,
// ordering and alias rules (docs/protocol.md, 'Masters, sessions and readiness').
#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "quantem/catalog/acquisition.hpp"

namespace quantem::catalog {

struct Session {
  std::string path;    // relative POSIX path of the directory, "." for the root
  std::string directory;  // absolute
  std::string source;  // source and date: the relative path's last two parts
  std::string date;
  std::vector<Acquisition> files;  // sorted by name
};

struct Catalog {
  std::string data_folder;            // absolute, not symlink-resolved
  std::vector<Session> sessions;      // sorted by plain string order of path
  std::map<std::string, std::string> session_directories;  // id or legacy alias -> absolute directory

  // Finds a session by id or alias; nullptr when unknown.
  const Session* find_session(const std::string& id) const;
};

// Absolute form of a folder argument: expanduser + absolute, no symlink resolution.
std::string absolute_folder(const std::string& folder);

// Every catalogued master under data_folder, absolute paths, in the reference's
// component-wise order. Skips `_`/`.` components; does not descend into
// symlinked directories; skips (with a warning) paths that are not valid UTF-8
// (JSON could not carry them). A missing or unreadable folder gives an empty list.
std::vector<std::string> discover_masters(const std::string& data_folder);

// A directory the walk could not list (its masters are missing from the catalog).
struct UnreadableDirectory {
  std::string path;    // absolute
  std::string reason;  // the system's message, e.g. "Permission denied"
};
// The same, also telling which directories could not be listed (the folder
// itself included).
// With threads > 1 the data folder's subdirectories are walked on that many
// threads at once (the same result).
std::vector<std::string> discover_masters(const std::string& data_folder, std::vector<UnreadableDirectory>* unreadable,
                                          std::size_t threads = 1);

// How a master is inspected: inspect_master in this process, or the daemon's
// crash-isolated inspector (inspector/inspector.hpp).
using InspectFunction = std::function<Acquisition(const std::string& master_path)>;

// Walks and inspects everything (with inspect_master, or with `inspect`). A
// master whose inspection throws is left out with a warning, except a
// quantem::Error of kind `unavailable` (the inspector cannot run), which ends
// the build.
Catalog build_catalog(const std::string& data_folder);
Catalog build_catalog(const std::string& data_folder, const InspectFunction& inspect);

struct BuildOptions {
  // Inspections run on this many threads at once (1: on the caller's thread);
  // `inspect` must then be thread-safe (the inspector's worker pool is).
  std::size_t threads = 1;
  // A kept inspection of the master that is still current (its signature
  // stats the same), or nullopt: the master is inspected. Called from up to
  // `threads` threads at once (each master once).
  std::function<std::optional<Acquisition>(const std::string& master_path)> reuse;
  // Called on the caller's thread with the catalog of what is known so far:
  // once after the kept inspections, then at most every progress_interval.
  std::function<void(const Catalog& partial)> progress;
  std::chrono::milliseconds progress_interval{250};
  // When set, the reports after the first are made only while it returns
  // true (a snapshot copies everything known: only when someone looks).
  std::function<bool()> progress_wanted;
};

struct BuildCounts {
  std::size_t reused = 0;     // masters answered by options.reuse
  std::size_t inspected = 0;  // masters inspected
};

// build_catalog with kept inspections, parallel inspection and progress; the
// same catalog as the sequential build. A quantem::Error of kind
// `unavailable` from any inspection ends the build (the others stop taking
// masters) and is rethrown.
// `masters` and `unreadable`, when given, receive the walk's masters and the
// folders it could not list (discover_masters), so the caller need not walk
// the folder again.
Catalog build_catalog(const std::string& data_folder, const InspectFunction& inspect, const BuildOptions& options,
                      BuildCounts* counts = nullptr, std::vector<std::string>* masters = nullptr,
                      std::vector<UnreadableDirectory>* unreadable = nullptr);

// The JSON document of GET /api/browse/sessions (docs/protocol.md, '3. Routes') with the
// reference's key order, byte-compatible when dumped with dump() (compact
// separators). Text that is not valid UTF-8 is repaired with U+FFFD so dump()
// never throws (discovery already skips undecodable names).
nlohmann::ordered_json sessions_document(const Catalog& catalog);
// The same document as compact text, byte for byte sessions_document(c).dump()
// with error_handler_t::replace, written without building the JSON tree (a
// folder of tens of thousands of masters).
std::string sessions_document_text(const Catalog& catalog);

// Python-compatible human size: "0 B", "1023 B", "1.0 KB", "9.6 KB", ...
std::string format_size(std::uint64_t bytes);

}  // namespace quantem::catalog
