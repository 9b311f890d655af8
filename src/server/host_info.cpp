#include "quantem/server/host_info.hpp"

#include <cstdio>

#include "quantem/backend/cuda_backend.hpp"
#include "quantem/core/version.hpp"
#include "quantem/server/runtime_files.hpp"
#include "quantem/server/service_manager.hpp"

namespace quantem::server {

namespace {

using json = nlohmann::ordered_json;

std::string cuda_version_text(int version) {
  if (version <= 0) return "none";
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

std::string gib(std::uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0));
  return text;
}

}  // namespace

json host_info_document(const HostInfoOptions& options) {
  json document;
  document["version"] = version_string();
  document["revision"] = build_git_revision();

  backend::CudaBackendOptions cuda_options;
  cuda_options.budget_bytes = options.device_budget_bytes;
  const backend::CudaSystemReport cuda = backend::cuda_system_report(cuda_options);
  json cuda_document;
  cuda_document["built_with_cuda"] = cuda.built_with_cuda;
  cuda_document["driver_version"] = cuda.built_with_cuda ? json(cuda_version_text(cuda.driver_version)) : json(nullptr);
  cuda_document["runtime_version"] = cuda.built_with_cuda ? json(cuda_version_text(cuda.runtime_version)) : json(nullptr);
  cuda_document["error"] = cuda.error.empty() ? json(nullptr) : json(cuda.error);
  json gpus = json::array();
  for (const auto& device : cuda.devices) {
    json gpu;
    gpu["index"] = device.index;
    gpu["name"] = device.name;
    gpu["total_bytes"] = device.total_bytes;
    gpu["free_bytes"] = device.free_bytes;
    gpu["budget_bytes"] = device.budget_bytes;
    gpus.push_back(std::move(gpu));
  }
  cuda_document["gpus"] = std::move(gpus);
  document["cuda"] = std::move(cuda_document);
  document["systemd_notify"] = ServiceManagerNotifier::available_in_build();
  // What to change when `serve` (default --backend cuda) would find no GPU.
  document["advice"] = cuda.devices.empty()
                           ? json("no usable GPU: `quantem-gpu serve` needs --backend cpu on this host (in the user "
                                  "service: --backend cpu in QUANTEM_GPU_OPTIONS), or a GPU that CUDA can see")
                           : json(nullptr);

  const std::string directory = runtime_directory();
  document["runtime_directory"] = directory;
  json daemons = json::array();
  for (auto runtime : live_runtime_files(directory)) {
    json daemon;
    for (const char* key : {"pid", "url", "url_form", "curl_args", "unix_socket", "version", "backend", "data_folder", "started_at"}) {
      if (runtime.contains(key)) daemon[key] = runtime[key];
    }
    daemon["token_mode"] = runtime.contains("token") && runtime["token"].is_string();
    daemons.push_back(std::move(daemon));
  }
  document["daemons"] = std::move(daemons);
  return document;
}

std::string host_info_text(const json& document) {
  std::string text = "quantem-gpu " + document["version"].get<std::string>() + " (revision " +
                     document["revision"].get<std::string>() + ")\n";
  const json& cuda = document["cuda"];
  if (!cuda["built_with_cuda"].get<bool>()) {
    text += "CUDA: not available in this build\n";
  } else {
    text += "CUDA: driver " + cuda["driver_version"].get<std::string>() + ", runtime " +
            cuda["runtime_version"].get<std::string>() + "\n";
    if (cuda["gpus"].empty()) {
      text += "GPUs: no CUDA device";
      if (cuda["error"].is_string()) text += " (" + cuda["error"].get<std::string>() + ")";
      text += "\n";
    }
    for (const auto& gpu : cuda["gpus"]) {
      text += "GPU " + std::to_string(gpu["index"].get<int>()) + ": " + gpu["name"].get<std::string>() + ", " +
              gib(gpu["total_bytes"].get<std::uint64_t>()) + " total, " + gib(gpu["free_bytes"].get<std::uint64_t>()) +
              " free, admission budget " + gib(gpu["budget_bytes"].get<std::uint64_t>()) + "\n";
    }
  }
  if (document["advice"].is_string()) text += "advice: " + document["advice"].get<std::string>() + "\n";
  text += std::string("systemd notify (Type=notify): ") +
          (document["systemd_notify"].get<bool>() ? "yes" : "no, this build has no libsystemd (use Type=simple)") + "\n";
  text += "runtime directory: " + document["runtime_directory"].get<std::string>() + "\n";
  if (document["daemons"].empty()) {
    text += "daemon: none of this user is running\n";
  }
  for (const auto& daemon : document["daemons"]) {
    text += "daemon: running, pid " + std::to_string(daemon.value("pid", 0)) + ", " + daemon.value("url", std::string("?"));
    if (daemon.contains("unix_socket") && daemon["unix_socket"].is_string()) {
      text += ", unix socket " + daemon["unix_socket"].get<std::string>();
    }
    text += ", data folder " + daemon.value("data_folder", std::string("?"));
    if (daemon.value("token_mode", false)) text += ", token mode";
    text += ", started " + daemon.value("started_at", std::string("?")) + "\n";
  }
  return text;
}

}  // namespace quantem::server
