#pragma once
// What the export tests look at in an export folder, and how they start an
// export they mean to interrupt.
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace quantem::test {

// The names in `folder`, sorted.
std::vector<std::string> folder_entries(const std::string& folder);
// Nothing in `folder` that a catalog would list (every name hidden).
bool nothing_finished_looking(const std::string& folder);
// Waits until some hidden incomplete folder in `folder` holds a data file.
bool wait_for_partial_data(const std::string& folder, std::chrono::seconds limit);
// Starts `binary arguments...` with the environment plus `extra_env`
// ("NAME=value" entries), stdout and stderr to /dev/null, without waiting.
pid_t spawn_quietly(const std::string& binary, const std::vector<std::string>& arguments,
                    const std::vector<std::string>& extra_env);

}  // namespace quantem::test
