#pragma once
// The catalog of a data folder: sessions (directories that directly contain
// masters) and their acquisitions, with the reference's discovery, exclusion,
// ordering and alias rules (docs/protocol.md, 'Masters, sessions and readiness').
#include <functional>
#include <map>
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
std::vector<std::string> discover_masters(const std::string& data_folder, std::vector<UnreadableDirectory>* unreadable);

// How a master is inspected: inspect_master in this process, or the daemon's
// crash-isolated inspector (inspector/inspector.hpp).
using InspectFunction = std::function<Acquisition(const std::string& master_path)>;

// Walks and inspects everything (with inspect_master, or with `inspect`). A
// master whose inspection throws is left out with a warning, except a
// quantem::Error of kind `unavailable` (the inspector cannot run), which ends
// the build.
Catalog build_catalog(const std::string& data_folder);
Catalog build_catalog(const std::string& data_folder, const InspectFunction& inspect);

// The JSON document of GET /api/browse/sessions (docs/protocol.md, '3. Routes') with the
// reference's key order, byte-compatible when dumped with dump() (compact
// separators). Text that is not valid UTF-8 is repaired with U+FFFD so dump()
// never throws (discovery already skips undecodable names).
nlohmann::ordered_json sessions_document(const Catalog& catalog);

// Python-compatible human size: "0 B", "1023 B", "1.0 KB", "9.6 KB", ...
std::string format_size(std::uint64_t bytes);

}  // namespace quantem::catalog
