#pragma once
// `quantem-gpu info`: what a user checking a host needs to know — version and
// revision, CUDA driver and runtime, each GPU's total and free memory and the
// admission budget serve would give it, whether this build notifies systemd,
// and the daemons of this user that are running (from their runtime files)
// with where they listen. Works on machines without CUDA ("CUDA: not
// available in this build" / "no CUDA device").
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace quantem::server {

struct HostInfoOptions {
  std::uint64_t device_budget_bytes = 0;  // as serve --device-budget; 0: 80% of each device's memory
};

// The report as a JSON document (`info --json`); tokens are never included.
nlohmann::ordered_json host_info_document(const HostInfoOptions& options);

// The same report as lines of text (`info`).
std::string host_info_text(const nlohmann::ordered_json& document);

}  // namespace quantem::server
