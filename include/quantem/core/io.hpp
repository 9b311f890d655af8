#pragma once
// Writing to a file descriptor, the one loop every component uses.
#include <string_view>

namespace quantem {

// Writes all of `bytes` to `fd`, again after a short write or EINTR. false
// when a write fails (errno says why) or writes nothing.
bool write_all(int fd, std::string_view bytes) noexcept;

}  // namespace quantem
