#pragma once
#include <string>

namespace quantem {

// The semantic version of this build ("0.1.0").
const char* version_string() noexcept;
// The git revision the build was configured from, or "unrecorded".
const char* build_git_revision() noexcept;

}  // namespace quantem
