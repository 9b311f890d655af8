#pragma once
// Internal: the CPU resident and the builder that fills it frame by frame
// (from decoded chunks in load(), or from a dense array).
#include <cstdint>
#include <memory>
#include <vector>

#include "cpu/host_buffer.hpp"
#include "cpu/thread_pool.hpp"
#include "quantem/backend/backend.hpp"

namespace quantem::backend::cpu {

class CpuResident final : public Resident {
 public:
  CpuResident(catalog::Acquisition source, DType code_dtype, HostBuffer codes, std::vector<std::uint64_t> pattern_sum,
              std::vector<std::uint64_t> frame_totals, std::shared_ptr<ThreadPool> pool, int device_index);

  int device_index() const override { return device_index_; }
  std::uint64_t resident_bytes() const override;
  std::string encoding() const override;
  DType resident_dtype() const override { return code_dtype_; }
  const catalog::Acquisition& source() const override { return source_; }

  std::vector<std::uint64_t> pattern_sum(const plan::PlanGeometry& geometry) override;
  std::vector<std::uint64_t> masked_sum(const plan::PlanGeometry& geometry,
                                        const std::vector<std::uint8_t>& binned_detector_mask) override;
  CenterOfMassSums center_of_mass_sums(const plan::PlanGeometry& geometry) override;
  std::vector<std::uint64_t> frame(const plan::PlanGeometry& geometry, std::uint64_t scan_row,
                                   std::uint64_t scan_col) override;
  std::vector<std::uint64_t> region_reduce(const plan::PlanGeometry& geometry,
                                           const std::vector<std::uint64_t>& positions,
                                           RegionReduce reduce) override;

 private:
  template <class Code>
  const Code* frame_codes(std::uint64_t frame) const {
    return reinterpret_cast<const Code*>(codes_.data()) + frame * frame_pixels_;
  }
  template <class Visit>
  decltype(auto) with_code_type(Visit&& visit) const;
  void check_geometry(const plan::PlanGeometry& geometry) const;

  template <class Code>
  std::vector<std::uint64_t> masked_frame_sums(const plan::PlanGeometry& geometry, const std::vector<std::uint8_t>& mask);
  template <class Code>
  std::vector<std::uint64_t> cropped_pattern_sum(const plan::PlanGeometry& geometry);
  template <class Code>
  void center_of_mass_frames(const plan::PlanGeometry& geometry, std::vector<std::uint64_t>& total,
                             std::vector<std::uint64_t>& row_moment, std::vector<std::uint64_t>& col_moment);
  template <class Code>
  void add_block(const plan::PlanGeometry& geometry, std::uint64_t position, std::uint64_t* native_sum) const;
  template <class Code>
  std::vector<std::uint64_t> region_max(const plan::PlanGeometry& geometry, const std::vector<std::uint64_t>& positions);

  catalog::Acquisition source_;
  DType code_dtype_;
  HostBuffer codes_;
  std::uint64_t frame_pixels_;
  std::vector<std::uint64_t> pattern_sum_;   // Σ over every frame, per detector pixel (computed while building)
  std::vector<std::uint64_t> frame_totals_;  // Σ over each frame's pixels
  std::shared_ptr<ThreadPool> pool_;
  int device_index_;
};

// Thrown by ResidentBuilder::finish_frame when a uint32 source held as 16-bit
// codes meets a masked count above 65535: the caller starts again with 32-bit codes.
struct NeedsWideCodes {};

// Fills a CpuResident from any number of threads, one frame at a time.
class ResidentBuilder {
 public:
  // The code type a build starts with: the source type, except uint32 -> uint16.
  static DType initial_code_dtype(DType source_dtype);
  // Every byte a build allocates besides the codes (pattern sums, totals, per-participant scratch).
  static std::uint64_t working_bytes(const catalog::Acquisition& source, DType code_dtype, unsigned participants);
  static std::uint64_t code_bytes(const catalog::Acquisition& source, DType code_dtype);

  // Throws std::bad_alloc when memory runs out.
  ResidentBuilder(const catalog::Acquisition& source, DType code_dtype, std::shared_ptr<ThreadPool> pool);

  // Where frame `frame`'s decoded source values (source element size each)
  // must be written before finish_frame: the resident slot itself, or
  // per-participant scratch when a uint32 source is narrowed.
  std::uint8_t* decode_target(std::uint64_t frame, unsigned participant);
  // Zeroes the masked pixels, narrows (throws NeedsWideCodes), accumulates sums.
  void finish_frame(std::uint64_t frame, unsigned participant);
  std::shared_ptr<CpuResident> finish(int device_index);

 private:
  struct Participant {
    std::vector<std::uint32_t> narrowing_scratch;  // one decoded uint32 frame
    std::vector<std::uint32_t> pattern_narrow;     // per-pixel partial sums of 8/16-bit codes
    std::vector<std::uint64_t> pattern_wide;
    std::uint32_t frames_in_narrow = 0;
  };
  void flush(Participant& participant);

  catalog::Acquisition source_;
  DType source_dtype_;
  DType code_dtype_;
  std::uint64_t frame_pixels_;
  std::vector<std::uint32_t> masked_pixels_;
  HostBuffer codes_;
  std::vector<std::uint64_t> frame_totals_;
  std::vector<Participant> participants_;
  std::shared_ptr<ThreadPool> pool_;
};

}  // namespace quantem::backend::cpu
