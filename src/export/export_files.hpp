#pragma once
// The file-system side of an export (private to src/export): the hidden
// incomplete folder with its lock, the free-space figure, the final rename.
#include <cstdint>
#include <string>

namespace quantem::exporter::detail {

// `.<name>.incomplete-export` in the output folder, created with a marker
// file inside, written first (".export-lock": a fixed first line, then the
// writer's pid and host), that this object holds locked (flock) until it is
// destroyed. The marker tells remove_abandoned_exports the folder is an
// export's; the lock that the writer is alive (a process that dies drops it).
// A folder, file or symlink of that name without the marker is never removed.
// Unless commit() succeeded, the destructor removes the folder.
class IncompleteFolder {
 public:
  // Throws not_found (no output folder), io (not a folder, not writable),
  // conflict (the final folder exists, a live writer holds this name, or
  // something not made by an export does).
  IncompleteFolder(const std::string& output_folder, const std::string& name);
  ~IncompleteFolder();
  IncompleteFolder(const IncompleteFolder&) = delete;
  IncompleteFolder& operator=(const IncompleteFolder&) = delete;

  const std::string& path() const { return path_; }
  const std::string& final_path() const { return final_path_; }
  // Renames the folder to <output_folder>/<name> without replacing anything
  // (conflict when it appeared meanwhile). The lock file is removed first.
  void commit();

 private:
  std::string path_;
  std::string final_path_;
  std::string lock_path_;
  int lock_fd_ = -1;
  bool committed_ = false;
};

// Free bytes for an unprivileged writer in `folder` (statvfs f_bavail), or the
// test variable's figure when set. Throws io when statvfs fails.
std::uint64_t free_bytes(const std::string& folder);

// Sum of the sizes of the regular files directly in `folder` (0 on errors).
std::uint64_t folder_file_bytes(const std::string& folder) noexcept;

// Whether `incomplete_folder` is a real folder (not a symlink) holding an
// export's marker.
bool is_marked_export(const std::string& incomplete_folder) noexcept;

// Whether the folder is an export's (is_marked_export) and its lock can be
// taken: nobody is writing it.
bool is_abandoned(const std::string& incomplete_folder) noexcept;

}  // namespace quantem::exporter::detail
