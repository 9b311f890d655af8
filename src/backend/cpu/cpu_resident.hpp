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
#include "quantem/backend/thread_pool.hpp"
#include "quantem/backend/backend.hpp"

namespace quantem::backend::cpu {

constexpr std::uint64_t kGroupFrames = 32;
// Longest detector axis the CPU resident holds (32-bit row/column sums of 16-bit codes stay exact).
constexpr std::uint64_t kMaxDetectorAxis = 65536;
using LaneMask = std::uint32_t;  // bit l: lane l of a group
static_assert(sizeof(LaneMask) * 8 == kGroupFrames, "one mask bit per lane");

// The frames of a set, grouped: (group index, lanes), ascending by group.
using GroupLanes = std::vector<std::pair<std::uint64_t, LaneMask>>;

// Exact per-frame values computed while building, so that pattern sums of
// uncropped plans and every centre-of-mass product need no pass over the codes.
struct FrameSummaries {
  std::vector<std::uint64_t> pattern_sum;   // Σ over every frame, per detector pixel
  std::vector<std::uint64_t> frame_totals;  // Σ over each frame's pixels
  // Projections: [frame][detector_row] Σ over the row, [frame][detector_col]
  // Σ over the column; 32-bit values for 8/16-bit codes, 64-bit for 32-bit codes.
  bool wide_projections = false;
  HostBuffer row_projections;
  HostBuffer col_projections;

  static std::uint64_t bytes(const catalog::Acquisition& source, DType code_dtype);
};

class CpuResident final : public Resident {
 public:
  CpuResident(catalog::Acquisition source, DType code_dtype, HostBuffer codes, FrameSummaries summaries,
              std::shared_ptr<ThreadPool> pool, int device_index);

  int device_index() const override { return device_index_; }
  std::uint64_t resident_bytes() const override;
  std::string encoding() const override;
  DType resident_dtype() const override { return code_dtype_; }
  const catalog::Acquisition& source() const override { return source_; }

 protected:
  std::vector<std::uint64_t> compute_pattern_sum(const plan::PlanGeometry& geometry) override;
  std::vector<std::uint64_t> compute_masked_sum(const plan::PlanGeometry& geometry,
                                                const std::vector<std::uint8_t>& binned_detector_mask) override;
  // One walk over the plan's groups for every mask: each source pixel is read
  // at most once, whatever the number of masks (masked_frame_sums_together).
  std::vector<std::optional<std::vector<std::uint32_t>>> compute_masked_sums_u32(
      const plan::PlanGeometry& geometry, const std::vector<std::vector<std::uint8_t>>& binned_detector_masks) override;
  CenterOfMassSums compute_center_of_mass_sums(const plan::PlanGeometry& geometry) override;
  std::vector<std::uint64_t> compute_frame(const plan::PlanGeometry& geometry, std::uint64_t scan_row,
                                           std::uint64_t scan_col) override;
  std::vector<std::uint64_t> compute_region_reduce(const plan::PlanGeometry& geometry,
                                                   const std::vector<std::uint64_t>& sorted_positions,
                                                   RegionReduce reduce) override;
  // Unbinned plans: each run of positions whose frames share a group is
  // copied out of the group's lines at once; binned plans: the default.
  bool compute_frames_u32(const plan::PlanGeometry& geometry, std::uint64_t first_position, std::uint64_t count,
                          std::vector<std::uint32_t>& out) override;
  // Unbinned plans at the source's dtype: the same copy, straight into
  // frames of the export's element type, each encoded with the CPU codec (no
  // uint32 frames, no narrowing pass); binned plans: false (the export's
  // host path over frames_u32).
  bool compute_export_chunks(const plan::PlanGeometry& geometry, std::uint64_t first_position, std::uint64_t count,
                             std::size_t element_size, EncodedChunks& out) override;

 private:
  // Unbinned frames of plan positions [first_position, first_position + count)
  // as Out values, frame after frame at `out`.
  template <class Out>
  void copy_unbinned_frames(const plan::PlanGeometry& geometry, std::uint64_t first_position, std::uint64_t count,
                            Out* out) const;
  template <class Code>
  const Code* group_codes(std::uint64_t group) const {
    return reinterpret_cast<const Code*>(codes_.data()) + group * frame_pixels_ * kGroupFrames;
  }
  template <class Visit>
  decltype(auto) with_code_type(Visit&& visit) const;

  // Per-frame values over the plan's region, row-major over the region.
  template <class Code>
  std::vector<std::uint64_t> masked_frame_sums(const plan::PlanGeometry& geometry, const std::vector<std::uint8_t>& mask);
  // The same for several masks at once, per mask.
  template <class Code>
  std::vector<std::vector<std::uint64_t>> masked_frame_sums_together(
      const plan::PlanGeometry& geometry, const std::vector<std::vector<std::uint8_t>>& masks);
  template <class Projection>
  void center_of_mass_frames(const plan::PlanGeometry& geometry, std::vector<std::uint64_t>& total,
                             std::vector<std::uint64_t>& row_moment, std::vector<std::uint64_t>& col_moment);
  // Σ of the given frames per native detector pixel, added into native_sum.
  template <class Code>
  void add_frames(const GroupLanes& frames, std::uint64_t* native_sum, bool parallel);
  template <class Code>
  std::vector<std::uint64_t> region_max(const plan::PlanGeometry& geometry, const std::vector<std::uint64_t>& positions);

  friend class ResidentBuilder;  // fills the codes and summaries in place
  catalog::Acquisition source_;
  DType code_dtype_;
  HostBuffer codes_;
  std::uint64_t frame_pixels_;
  FrameSummaries summaries_;
  std::shared_ptr<ThreadPool> pool_;
  int device_index_;
};

// Thrown by ResidentBuilder::finish_group when a uint32 source held as 16-bit
// codes meets a masked count above 65535: the caller starts again with 32-bit codes.
struct NeedsWideCodes {};

// Fills a CpuResident from any number of threads, one frame group per call.
// The resident exists from the start (resident()) and is filled in place, so
// a load may publish it before every group is built: the codes and the
// per-frame summaries of a finished group are never written again, and the
// pattern sum over every frame is filled by finish().
class ResidentBuilder {
 public:
  // The code type a build starts with: the source type, except uint32 -> uint16.
  static DType initial_code_dtype(DType source_dtype);
  static std::uint64_t group_count(const catalog::Acquisition& source);
  static std::uint64_t code_bytes(const catalog::Acquisition& source, DType code_dtype);
  // Every byte a build allocates besides the codes and the summaries (per-participant scratch).
  static std::uint64_t working_bytes(const catalog::Acquisition& source, DType code_dtype, unsigned participants);

  // Throws std::bad_alloc when memory runs out.
  ResidentBuilder(const catalog::Acquisition& source, DType code_dtype, std::shared_ptr<ThreadPool> pool,
                  int device_index);

  // The resident being built (its held rows are the caller's to move).
  const std::shared_ptr<CpuResident>& resident() const { return resident_; }

  // A participant builds one group at a time: for each of its frames, in any
  // order, write the decoded source values (frame_pixels values of the source
  // dtype) to decode_target and call finish_frame while the frame is hot in
  // cache; then finish_group stores the group's codes.
  std::uint8_t* decode_target(std::uint64_t frame, unsigned participant);
  // Zeroes masked pixels, checks narrowing (throws NeedsWideCodes), computes the frame's summaries.
  void finish_frame(std::uint64_t frame, unsigned participant);
  void finish_group(std::uint64_t group, unsigned participant);
  // Fills the pattern sum over every frame; the resident is then whole.
  std::shared_ptr<CpuResident> finish();

 private:
  struct Participant {
    std::vector<std::uint8_t> frames;            // kGroupFrames decoded frames, source dtype
    std::vector<std::uint32_t> pattern_narrow;   // per-pixel partial sums of 8/16-bit values
    std::vector<std::uint64_t> pattern_wide;
    std::uint32_t frames_in_narrow = 0;
  };
  template <class Visit>
  void with_types(Visit&& visit);  // visit(Source{}, Code{})
  template <class Source, class Code>
  void finish_frame_typed(std::uint64_t frame, Participant& participant);
  template <class Source, class Code>
  void store_group_typed(std::uint64_t group, Participant& participant);
  template <class Source, class Projection, class PatternSum>
  std::uint64_t summarize_frame(const Source* values, std::uint64_t frame, PatternSum* pattern);
  void flush(Participant& participant);

  catalog::Acquisition source_;
  DType source_dtype_;
  DType code_dtype_;
  std::uint64_t frame_pixels_;
  std::vector<std::uint32_t> masked_pixels_;
  std::vector<Participant> participants_;
  std::shared_ptr<ThreadPool> pool_;
  std::shared_ptr<CpuResident> resident_;
  HostBuffer& codes_;          // resident_->codes_
  FrameSummaries& summaries_;  // resident_->summaries_
};

}  // namespace quantem::backend::cpu
