#include "quantem/backend/backend.hpp"

#include <algorithm>

#include "quantem/catalog/catalog.hpp"
#include "quantem/core/error.hpp"

namespace quantem::backend {

const char* load_stage_name(LoadStage stage) noexcept {
  switch (stage) {
    case LoadStage::queued: return "queued";
    case LoadStage::reading: return "reading";
    case LoadStage::decoding: return "decoding";
    case LoadStage::encoding: return "encoding";
    case LoadStage::done: return "done";
    case LoadStage::failed: return "failed";
    case LoadStage::cancelled: return "cancelled";
  }
  return "unknown";
}

LocalLoadReservation::LocalLoadReservation(int device_index, std::uint64_t initial_bytes,
                                           std::optional<std::uint64_t> limit_bytes)
    : device_index_(device_index), reserved_(initial_bytes), largest_(initial_bytes), limit_(limit_bytes) {}

void LocalLoadReservation::grow(std::uint64_t bytes) {
  ++grow_calls_;
  if (limit_ && (bytes > *limit_ || reserved_ > *limit_ - bytes)) {
    throw payload_too_large("the load needs " + catalog::format_size(reserved_ + bytes) + " on device " +
                            std::to_string(device_index_) + " but its reservation is limited to " +
                            catalog::format_size(*limit_));
  }
  reserved_ += bytes;
  largest_ = std::max(largest_, reserved_);
}

void LocalLoadReservation::release(std::uint64_t bytes) { reserved_ -= std::min(bytes, reserved_); }

std::shared_ptr<Resident> Backend::load(const catalog::Acquisition& acquisition, int device_index,
                                        LoadProgress& progress) {
  std::uint64_t admitted = 0;  // an acquisition the estimate refuses is refused by load() with the same error
  try {
    admitted = estimate_load(acquisition).transition_peak_bytes;
  } catch (const Error&) {
  }
  LocalLoadReservation reservation(device_index, admitted);
  return load(acquisition, device_index, progress, reservation);
}

}  // namespace quantem::backend
