// The CUDA resident's masked sums (BF, ABF, ADF, custom shapes): one mask, or
// the masks of several products of one plan in one pass. Each mask's rings
// held whole come from the ring table; every other selected pixel's stream is
// decoded once for all the pass's masks (kernels::ans_masked_sums); the sums
// are gathered into plan positions and narrowed where they are, and one copy
// brings back every mask's image and flags.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "cuda_resident.hpp"
#include "quantem/backend/stage_clock.hpp"
#include "quantem/kernels/ans.hpp"
#include "quantem/kernels/resident_products.hpp"
#include "quantem/kernels/scratch_layout.hpp"
#include "quantem/plan/plan.hpp"

namespace quantem::backend::cuda {
namespace {

kernels::PlanRegionView plan_region_view(const plan::PlanGeometry& g) {
  return kernels::PlanRegionView{g.region.row_start, g.region.row_stop, g.region.col_start, g.region.col_stop,
                                 g.source_scan_cols, g.scan_bin, g.scan_rows, g.scan_cols};
}

}  // namespace

CudaResident::MaskPass CudaResident::mask_pass(const plan::PlanGeometry& g,
                                               const std::vector<const std::vector<std::uint8_t>*>& binned_masks) const {
  MaskPass pass;
  pass.ring_starts.push_back(0);
  std::vector<std::vector<std::uint8_t>> decoded;
  decoded.reserve(binned_masks.size());
  for (const std::vector<std::uint8_t>* binned : binned_masks) {
    std::vector<std::uint8_t> native = plan::source_detector_mask(g, *binned);
    RingMaskSplit split = split_mask_by_rings(rings_.partition, native);
    pass.rings.insert(pass.rings.end(), split.whole_rings.begin(), split.whole_rings.end());
    pass.ring_starts.push_back(static_cast<std::uint32_t>(pass.rings.size()));
    decoded.push_back(split.whole_rings.empty() ? std::move(native) : std::move(split.residual_mask));
  }
  pass.entries = kernels::ans_mask_set_entries(decoded, static_cast<std::uint32_t>(source_.detector_rows),
                                               static_cast<std::uint32_t>(source_.detector_cols));
  return pass;
}

void CudaResident::enqueue_mask_pass(const MaskPass& pass, const kernels::AnsResidentView& groups,
                                     std::uint64_t base_frame, const MaskPassDevice& d, std::uint32_t* host_uploads,
                                     cudaStream_t stream) {
  const std::size_t entries = pass.entries.streams.size();
  std::copy(pass.entries.streams.begin(), pass.entries.streams.end(), host_uploads);
  std::copy(pass.entries.quads.begin(), pass.entries.quads.end(), host_uploads + entries);
  std::copy(pass.rings.begin(), pass.rings.end(), host_uploads + 2 * entries);
  if (pass.upload_words() != 0) {
    QUANTEM_CUDA_TRY(cudaMemcpyAsync(d.uploads, host_uploads, pass.upload_words() * 4, cudaMemcpyHostToDevice, stream));
  }
  const std::uint32_t* d_streams = d.uploads;
  kernels::ans_masked_sums(groups, d_streams, d_streams + entries, static_cast<std::uint32_t>(entries), pass.masks(),
                           d.sums, d.error, stream);
  for (std::uint32_t m = 0; m < pass.masks(); ++m) {
    const std::uint32_t first_ring = pass.ring_starts[m];
    const std::uint32_t ring_count = pass.ring_starts[m + 1] - first_ring;
    if (ring_count == 0) continue;
    kernels::add_ring_sums(rings_.d_ring_sums.data(), rings_.sum_bytes, source_.frame_count(),
                           d_streams + 2 * entries + first_ring, ring_count, base_frame, groups.total_frames,
                           d.sums + std::uint64_t{m} * groups.total_frames, stream);
  }
}

std::vector<std::optional<std::vector<std::uint32_t>>> CudaResident::compute_masked_sums_u32(
    const plan::PlanGeometry& g, const std::vector<std::vector<std::uint8_t>>& binned_masks) {
  std::vector<std::optional<std::vector<std::uint32_t>>> images;
  images.reserve(binned_masks.size());
  for (std::size_t first = 0; first < binned_masks.size(); first += kernels::kAnsMasksPerPass) {
    std::vector<const std::vector<std::uint8_t>*> masks;
    for (std::size_t i = first; i < std::min(binned_masks.size(), first + kernels::kAnsMasksPerPass); ++i) {
      masks.push_back(&binned_masks[i]);
    }
    narrow_mask_pass(g, mask_pass(g, masks), images);
  }
  return images;
}

std::optional<std::vector<std::uint32_t>> CudaResident::compute_masked_sum_u32(
    const plan::PlanGeometry& g, const std::vector<std::uint8_t>& binned_mask) {
  std::vector<std::optional<std::vector<std::uint32_t>>> images;
  narrow_mask_pass(g, mask_pass(g, {&binned_mask}), images);
  return std::move(images.front());
}

void CudaResident::narrow_mask_pass(const plan::PlanGeometry& g, const MaskPass& pass,
                                    std::vector<std::optional<std::vector<std::uint32_t>>>& images) {
  stage_lap("mask");  // the pass built: source masks, ring splits, stream entries
  const RegionSpan span = region_span(g);
  const kernels::AnsResidentView groups = view_of_groups(span.first_group, span.end_group);
  const std::uint64_t base_frame = span.first_group * frames_per_group_;
  const std::uint32_t masks = pass.masks();
  const std::uint64_t positions = g.positions();
  bind_device();
  const cudaStream_t stream = cudaStreamPerThread;
  // What comes back lies together: the decode error flag, each mask's
  // overflow flag, each mask's image (uint32 per position).
  kernels::ScratchLayout layout;
  const std::size_t sums_at = layout.add(std::uint64_t{masks} * groups.total_frames * 8);
  const std::size_t uploads_at = layout.add(pass.upload_words() * 4);
  const std::size_t flags_at = layout.add((1 + std::size_t{masks}) * 4);
  const std::size_t images_at = layout.add(std::uint64_t{masks} * positions * 4);
  ScratchBuffer scratch(layout.total(), stream);
  MaskPassDevice d;
  d.sums = kernels::scratch_part<std::uint64_t>(scratch.data(), sums_at);
  d.uploads = kernels::scratch_part<std::uint32_t>(scratch.data(), uploads_at);
  d.error = kernels::scratch_part<std::uint32_t>(scratch.data(), flags_at);
  auto* d_images = kernels::scratch_part<std::uint32_t>(scratch.data(), images_at);
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d.error, 0, (1 + std::size_t{masks}) * 4, stream));
  const std::size_t result_bytes = layout.total() - flags_at;
  kernels::ScratchLayout host_layout;
  const std::size_t host_result_at = host_layout.add(result_bytes);
  const std::size_t host_uploads_at = host_layout.add(pass.upload_words() * 4);
  const HostStaging host(*this, host_layout.total());
  stage_lap("staging");
  enqueue_mask_pass(pass, groups, base_frame, d, host.part<std::uint32_t>(host_uploads_at), stream);
  const kernels::PlanRegionView region = plan_region_view(g);
  for (std::uint32_t m = 0; m < masks; ++m) {
    kernels::narrow_plan_sums(d.sums + std::uint64_t{m} * groups.total_frames, base_frame, region,
                              d_images + m * positions, d.error + 1 + m, stream);
  }
  QUANTEM_CUDA_TRY(
      cudaMemcpyAsync(host.part<void>(host_result_at), d.error, result_bytes, cudaMemcpyDeviceToHost, stream));
  stage_lap("enqueue");  // scratch, uploads, kernels, the copy back
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  stage_lap("wait");
  const auto* flags = host.part<std::uint32_t>(host_result_at);
  throw_if_malformed(flags[0], source_.name, "masked_sum_kernel");
  const auto* h_images = host.part<std::uint32_t>(host_result_at + (images_at - flags_at));
  for (std::uint32_t m = 0; m < masks; ++m) {
    if (flags[1 + m] != 0) {
      images.emplace_back(std::nullopt);  // a sum past 2^32 - 1: never wrapped
    } else {
      images.emplace_back(std::vector<std::uint32_t>(h_images + m * positions, h_images + (m + 1) * positions));
    }
  }
  stage_lap("result");
}

std::vector<std::uint64_t> CudaResident::compute_masked_sum(const plan::PlanGeometry& g,
                                                            const std::vector<std::uint8_t>& binned_mask) {
  const MaskPass pass = mask_pass(g, {&binned_mask});
  const RegionSpan span = region_span(g);
  const kernels::AnsResidentView groups = view_of_groups(span.first_group, span.end_group);
  const std::uint64_t base_frame = span.first_group * frames_per_group_;
  bind_device();
  const cudaStream_t stream = cudaStreamPerThread;
  kernels::ScratchLayout layout;
  const std::size_t sums_at = layout.add(groups.total_frames * 8);
  const std::size_t uploads_at = layout.add(pass.upload_words() * 4);
  const std::size_t error_at = layout.add(4);
  ScratchBuffer scratch(layout.total(), stream);
  MaskPassDevice d;
  d.sums = kernels::scratch_part<std::uint64_t>(scratch.data(), sums_at);
  d.uploads = kernels::scratch_part<std::uint32_t>(scratch.data(), uploads_at);
  d.error = kernels::scratch_part<std::uint32_t>(scratch.data(), error_at);
  QUANTEM_CUDA_TRY(cudaMemsetAsync(d.error, 0, 4, stream));
  // Only the frames from the region's first to its last come back (uint64
  // each); a region of whole scan rows is exactly that span, in order.
  const std::uint64_t span_frames = span.last_frame - span.first_frame + 1;
  kernels::ScratchLayout host_layout;
  const std::size_t host_span_at = host_layout.add(span_frames * 8);
  const std::size_t host_error_at = host_layout.add(4);
  const std::size_t host_uploads_at = host_layout.add(pass.upload_words() * 4);
  const HostStaging host(*this, host_layout.total());
  enqueue_mask_pass(pass, groups, base_frame, d, host.part<std::uint32_t>(host_uploads_at), stream);
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(host.part<void>(host_span_at), d.sums + (span.first_frame - base_frame),
                                   span_frames * 8, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaMemcpyAsync(host.part<void>(host_error_at), d.error, 4, cudaMemcpyDeviceToHost, stream));
  QUANTEM_CUDA_TRY(cudaStreamSynchronize(stream));
  throw_if_malformed(*host.part<std::uint32_t>(host_error_at), source_.name, "masked_sum_kernel");
  const auto* h_span = host.part<std::uint64_t>(host_span_at);
  std::vector<std::uint64_t> per_frame;
  per_frame.reserve(plan::region_frame_count(g));
  plan::for_each_region_row(g, [&](std::uint64_t first, std::uint64_t end) {
    per_frame.insert(per_frame.end(), h_span + (first - span.first_frame), h_span + (end - span.first_frame));
  });
  return plan::bin_scan_sums(g, std::move(per_frame));
}

}  // namespace quantem::backend::cuda
