#pragma once
// Internal: the CPU resident and the builder that fills it one frame group at
// a time (from decoded chunks in load(), or from a dense array).
//
// Layout: frames are taken in groups of kGroupFrames consecutive frames
// (global row-major scan order). Group g holds frame_pixels lines of
// kGroupFrames codes: code(frame f, pixel p) is at
//   codes[(f / kGroupFrames * frame_pixels + p) * kGroupFrames + f % kGroupFrames].
// Lanes past the last frame are zero. Sums over a pixel set read only the
// lines of those pixels, contiguously for each run of pixels in a detector row.
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "cpu/host_buffer.hpp"
#include "cpu/thread_pool.hpp"
#include "quantem/backend/backend.hpp"

namespace quantem::backend::cpu {

constexpr std::uint64_t kGroupFrames = 32;
using LaneMask = std::uint32_t;  // bit l: lane l of a group
static_assert(sizeof(LaneMask) * 8 == kGroupFrames, "one mask bit per lane");

// The frames of a set, grouped: (group index, lanes), ascending by group.
using GroupLanes = std::vector<std::pair<std::uint64_t, LaneMask>>;

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
  const Code* group_codes(std::uint64_t group) const {
    return reinterpret_cast<const Code*>(codes_.data()) + group * frame_pixels_ * kGroupFrames;
  }
  template <class Visit>
  decltype(auto) with_code_type(Visit&& visit) const;
  void check_geometry(const plan::PlanGeometry& geometry) const;

  // Per-frame values over the plan's region, row-major over the region.
  template <class Code>
  std::vector<std::uint64_t> masked_frame_sums(const plan::PlanGeometry& geometry, const std::vector<std::uint8_t>& mask);
  template <class Code>
  void center_of_mass_frames(const plan::PlanGeometry& geometry, std::vector<std::uint64_t>& total,
                             std::vector<std::uint64_t>& row_moment, std::vector<std::uint64_t>& col_moment);
  // Σ of the given frames per native detector pixel, added into native_sum.
  template <class Code>
  void add_frames(const GroupLanes& frames, std::uint64_t* native_sum, bool parallel);
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

// Thrown by ResidentBuilder::finish_group when a uint32 source held as 16-bit
// codes meets a masked count above 65535: the caller starts again with 32-bit codes.
struct NeedsWideCodes {};

// Fills a CpuResident from any number of threads, one frame group per call.
class ResidentBuilder {
 public:
  // The code type a build starts with: the source type, except uint32 -> uint16.
  static DType initial_code_dtype(DType source_dtype);
  static std::uint64_t group_count(const catalog::Acquisition& source);
  static std::uint64_t code_bytes(const catalog::Acquisition& source, DType code_dtype);
  // Every byte a build allocates besides the codes (pattern sums, totals, per-participant scratch).
  static std::uint64_t working_bytes(const catalog::Acquisition& source, DType code_dtype, unsigned participants);

  // Throws std::bad_alloc when memory runs out.
  ResidentBuilder(const catalog::Acquisition& source, DType code_dtype, std::shared_ptr<ThreadPool> pool);

  // Where frame `frame`'s decoded source values (frame_pixels values of the
  // source dtype) must be written: the participant's scratch lane for it.
  std::uint8_t* decode_target(std::uint64_t frame, unsigned participant);
  // After every frame of `group` was written to this participant's scratch:
  // zeroes masked pixels, narrows (throws NeedsWideCodes), accumulates the
  // pattern sum and frame totals, and stores the group's codes.
  void finish_group(std::uint64_t group, unsigned participant);
  std::shared_ptr<CpuResident> finish(int device_index);

 private:
  struct Participant {
    std::vector<std::uint8_t> frames;            // kGroupFrames decoded frames, source dtype
    std::vector<std::uint32_t> pattern_narrow;   // per-pixel partial sums of 8/16-bit values
    std::vector<std::uint64_t> pattern_wide;
    std::uint32_t frames_in_narrow = 0;
  };
  template <class Source, class Code>
  void finish_group_typed(std::uint64_t group, Participant& participant);
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
