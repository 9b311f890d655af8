#include "quantem/backend/backend.hpp"

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

}  // namespace quantem::backend
