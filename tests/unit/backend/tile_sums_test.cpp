// Tile sums beside a resident: the grid rule, the whole tiles of a rectangle,
// and the sums a resident answers with its table equal to the sums it decodes
// without one, for crops at every alignment against the tile grid (inside one
// tile, across tiles, on tile edges, touching the scan's edges, one row, one
// column, the whole scan), with scan bins (partial edge bins) and detector
// bins, before and after the table is ready. A counting resident shows that
// the table is used: only the edge frames are decoded. The background builder
// holds the compute lock per tile, builds in order, survives a resident that
// is dropped (evicted) mid-build, and cancels on shutdown.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "dense_fixture.hpp"
#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/backend/tile_sums.hpp"
#include "quantem/plan/plan.hpp"

namespace quantem::test {
namespace {

using namespace std::chrono_literals;
using backend::RegionReduce;
using backend::ScanRectangle;
using backend::TileGrid;
using backend::TileSumsState;

// Delegates to a CPU resident that has no tile sums (so it always decodes)
// and counts the frames each decoding primitive reads.
class CountingResident final : public backend::Resident {
 public:
  explicit CountingResident(std::shared_ptr<backend::Resident> inner) : inner_(std::move(inner)) {}
  int device_index() const override { return inner_->device_index(); }
  std::uint64_t resident_bytes() const override { return inner_->resident_bytes(); }
  std::string encoding() const override { return inner_->encoding(); }
  DType resident_dtype() const override { return inner_->resident_dtype(); }
  const catalog::Acquisition& source() const override { return inner_->source(); }
  std::uint64_t decoded_frames() const { return decoded_; }
  void reset_count() { decoded_ = 0; }

 protected:
  std::vector<std::uint64_t> compute_pattern_sum(const plan::PlanGeometry& g) override {
    if (g.cropped) decoded_ += plan::region_frame_count(g);
    return inner_->pattern_sum(g);
  }
  std::vector<std::uint64_t> compute_masked_sum(const plan::PlanGeometry& g,
                                                const std::vector<std::uint8_t>& mask) override {
    return inner_->masked_sum(g, mask);
  }
  backend::CenterOfMassSums compute_center_of_mass_sums(const plan::PlanGeometry& g) override {
    return inner_->center_of_mass_sums(g);
  }
  std::vector<std::uint64_t> compute_frame(const plan::PlanGeometry& g, std::uint64_t row, std::uint64_t col) override {
    return inner_->frame(g, row, col);
  }
  std::vector<std::uint64_t> compute_region_reduce(const plan::PlanGeometry& g, const std::vector<std::uint64_t>& sorted,
                                                   RegionReduce reduce) override {
    for (const std::uint64_t p : sorted) decoded_ += plan::position_frame_indices(g, p).size();
    return inner_->region_reduce(g, sorted, reduce);
  }

 private:
  std::shared_ptr<backend::Resident> inner_;
  std::atomic<std::uint64_t> decoded_{0};
};

std::shared_ptr<backend::Resident> cpu_resident(const DenseCase& c) {
  const std::vector<std::uint8_t> bytes = c.source_bytes();
  backend::CpuResidentOptions options;
  options.threads = 2;
  return backend::make_cpu_resident(c.acquisition(), bytes.data(), bytes.size(), options);
}

// 37 x 35 positions: tiles of 16, a 3 x 3 grid whose last row and column are partial.
DenseCase grid_case(DType dtype = DType::uint16) {
  return random_case("tiles", dtype, 37, 35, 4, 5, 21, 3000, 1, 60000, true);
}

std::vector<ScanRectangle> crops_at_every_alignment(std::uint64_t rows, std::uint64_t cols) {
  // Tile boundaries, one before and after them, and the scan's edges.
  const std::vector<std::uint64_t> row_marks = {0, 1, 15, 16, 17, 31, 32, 33, rows - 1, rows};
  const std::vector<std::uint64_t> col_marks = {0, 1, 15, 16, 17, 31, 32, 34, cols};
  std::vector<ScanRectangle> crops;
  for (std::size_t a = 0; a < row_marks.size(); ++a)
    for (std::size_t b = a + 1; b < row_marks.size(); ++b)
      for (std::size_t c = 0; c < col_marks.size(); ++c)
        for (std::size_t d = c + 1; d < col_marks.size(); ++d)
          crops.push_back({row_marks[a], row_marks[b], col_marks[c], col_marks[d]});
  return crops;
}

plan::PlanGeometry geometry(const DenseCase& c, const ScanRectangle& r, std::uint64_t scan_bin,
                            std::uint64_t detector_bin) {
  plan::BrowsePlan p;
  p.crop = plan::ScanRegion{r.row_begin, r.row_end, r.col_begin, r.col_end};
  p.scan_bin = scan_bin;
  p.detector_bin = detector_bin;
  return plan::resolve_plan(p, c.scan_rows, c.scan_cols, c.detector_rows, c.detector_cols);
}

std::uint64_t area(const ScanRectangle& r) { return (r.row_end - r.row_begin) * (r.col_end - r.col_begin); }

}  // namespace

TEST(TileGrid, SquareTilesOfAtLeast16AndAtMost32PerAxis) {
  const TileGrid big = TileGrid::for_scan(512, 512);
  EXPECT_EQ(big.tile_side, 16u);
  EXPECT_EQ(big.rows, 32u);
  EXPECT_EQ(big.cols, 32u);
  EXPECT_EQ(big.table_bytes(192 * 192), 32u * 32u * 192u * 192u * 8u);
  const TileGrid wide = TileGrid::for_scan(100, 1024);
  EXPECT_EQ(wide.tile_side, 32u);
  EXPECT_EQ(wide.rows, 4u);  // the last tile holds 4 rows
  EXPECT_EQ(wide.cols, 32u);
  EXPECT_EQ(wide.tile_end(3, 100), 100u);
  const TileGrid odd = TileGrid::for_scan(1025, 3);
  EXPECT_EQ(odd.tile_side, 33u);
  EXPECT_LE(odd.rows, 32u);
  EXPECT_TRUE(TileGrid::for_scan(17, 5).worth_a_table());
  const TileGrid one = TileGrid::for_scan(16, 16);
  EXPECT_FALSE(one.worth_a_table());
  EXPECT_EQ(one.table_bytes(100), 0u);
}

TEST(TileSumTable, WholeTilesInsideARectangleCountTheScanEdgeTilesWholeAtTheEdge) {
  const TileGrid grid = TileGrid::for_scan(37, 35);
  const backend::TileSumTable table(grid, 1, std::vector<std::uint64_t>(grid.tiles(), 0));
  const auto whole = [&](ScanRectangle r) { return table.whole_tiles_inside(r); };
  EXPECT_FALSE(whole({1, 15, 1, 15}));   // inside one tile
  EXPECT_FALSE(whole({1, 31, 1, 31}));   // across tiles, none whole
  EXPECT_FALSE(whole({32, 36, 0, 35}));  // the partial last row of tiles, not reaching the edge
  auto w = whole({15, 37, 1, 33});
  ASSERT_TRUE(w);
  EXPECT_EQ(w->row_begin, 16u);
  EXPECT_EQ(w->row_end, 37u);  // reaches the scan's edge: the partial tile is whole
  EXPECT_EQ(w->col_begin, 16u);
  EXPECT_EQ(w->col_end, 32u);
  w = whole({0, 37, 0, 35});
  ASSERT_TRUE(w);
  EXPECT_EQ(area(*w), 37u * 35u);
}

TEST(TileSums, CropsAtEveryAlignmentEqualTheDecodedSumsAndDecodeOnlyTheirEdges) {
  const DenseCase c = grid_case();
  const auto inner = cpu_resident(c);
  const auto resident = std::make_shared<CountingResident>(inner);
  const auto crops = crops_at_every_alignment(c.scan_rows, c.scan_cols);
  std::vector<std::vector<std::uint64_t>> decoded;
  for (const ScanRectangle& r : crops) decoded.push_back(inner->pattern_sum(geometry(c, r, 1, 1)));

  // Before the table: every frame of the crop is decoded.
  EXPECT_EQ(resident->tile_sums().state(), TileSumsState::none);
  EXPECT_EQ(resident->pattern_sum(geometry(c, crops[7], 1, 1)), decoded[7]);
  EXPECT_EQ(resident->decoded_frames(), area(crops[7]));

  backend::build_tile_sums(resident);
  ASSERT_EQ(resident->tile_sums().state(), TileSumsState::ready) << resident->tile_sums().reason();
  const TileGrid grid = TileGrid::for_scan(c.scan_rows, c.scan_cols);
  EXPECT_EQ(resident->tile_sums().bytes(), grid.table_bytes(c.frame_pixels()));
  const auto table = resident->tile_sums().table();
  std::size_t used_tiles = 0;
  for (std::size_t i = 0; i < crops.size(); ++i) {
    const ScanRectangle& r = crops[i];
    const plan::PlanGeometry g = geometry(c, r, 1, 1);
    resident->reset_count();
    EXPECT_EQ(resident->pattern_sum(g), decoded[i]) << plan::to_string(g);
    const auto whole = table->whole_tiles_inside(r);
    if (!g.cropped) continue;  // the full scan: the resident's kept sum, no decode either way
    const std::uint64_t expected_decode = area(r) - (whole ? area(*whole) : 0);
    EXPECT_EQ(resident->decoded_frames(), expected_decode) << plan::to_string(g);
    used_tiles += whole ? 1 : 0;
  }
  // Both kinds occur: crops with whole tiles and crops that are all edge.
  EXPECT_GT(used_tiles, 100u);
  EXPECT_LT(used_tiles, crops.size() - 100);
}

TEST(TileSums, BinnedPlansAndRectanglesOfPositionsEqualTheDecodedSums) {
  for (const DType dtype : {DType::uint8, DType::uint16, DType::uint32}) {
    const DenseCase c = grid_case(dtype);
    const auto inner = cpu_resident(c);
    const auto resident = std::make_shared<CountingResident>(inner);
    backend::build_tile_sums(resident);
    ASSERT_EQ(resident->tile_sums().state(), TileSumsState::ready);
    const std::vector<ScanRectangle> crops = {{0, 37, 0, 35}, {3, 37, 1, 34}, {15, 33, 16, 35},
                                              {0, 1, 0, 35},  {0, 37, 20, 21}, {5, 36, 0, 35}};
    for (const ScanRectangle& r : crops) {
      for (const std::uint64_t scan_bin : {1u, 2u, 3u, 7u}) {
        for (const std::uint64_t detector_bin : {1u, 2u, 3u}) {
          const plan::PlanGeometry g = geometry(c, r, scan_bin, detector_bin);
          const std::string where = std::string(dtype_name(dtype)) + " " + plan::to_string(g);
          EXPECT_EQ(resident->pattern_sum(g), inner->pattern_sum(g)) << where;
          // Rectangles of plan positions: all, one row, one column, an inner block; and a non-rectangle.
          std::vector<std::vector<std::uint64_t>> sets(5);
          for (std::uint64_t p = 0; p < g.positions(); ++p) {
            const std::uint64_t row = p / g.scan_cols, col = p % g.scan_cols;
            sets[0].push_back(p);
            if (row == g.scan_rows - 1) sets[1].push_back(p);
            if (col == 0) sets[2].push_back(p);
            if (row >= g.scan_rows / 3 && col >= g.scan_cols / 4 && col + 1 < g.scan_cols) sets[3].push_back(p);
            if (row == 0 || col == 0) sets[4].push_back(p);
          }
          for (const auto& positions : sets) {
            if (positions.empty()) continue;
            for (const auto reduce : {RegionReduce::sum, RegionReduce::max}) {
              const auto want = inner->region_reduce(g, positions, reduce);
              EXPECT_EQ(resident->region_reduce(g, positions, reduce), want) << where;
              EXPECT_EQ(resident->region_reduce_u32(g, positions, reduce).has_value(),
                        inner->region_reduce_u32(g, positions, reduce).has_value())
                  << where;
              if (const auto narrow = resident->region_reduce_u32(g, positions, reduce)) {
                EXPECT_EQ(std::vector<std::uint64_t>(narrow->begin(), narrow->end()), want) << where;
              }
            }
          }
        }
      }
    }
  }
}

TEST(TileSums, ARectangleOfPositionsDecodesOnlyItsEdgeAndAnyOtherSetDecodesEveryFrame) {
  const DenseCase c = grid_case();
  const auto resident = std::make_shared<CountingResident>(cpu_resident(c));
  backend::build_tile_sums(resident);
  resident->reset_count();
  const plan::PlanGeometry g = plan::resolve_plan({}, c.scan_rows, c.scan_cols, c.detector_rows, c.detector_cols);
  std::vector<std::uint64_t> block, ragged;  // rows [10, 34) x columns [12, 35); the same less one position
  for (std::uint64_t row = 10; row < 34; ++row)
    for (std::uint64_t col = 12; col < 35; ++col) block.push_back(row * c.scan_cols + col);
  ragged.assign(block.begin() + 1, block.end());
  resident->region_reduce(g, block, RegionReduce::sum);
  // Whole tiles: rows 16..32 and columns 16..35 (the partial last column of tiles reaches the scan's edge).
  EXPECT_EQ(resident->decoded_frames(), block.size() - 16u * 19u);
  resident->reset_count();
  resident->region_reduce(g, ragged, RegionReduce::sum);
  EXPECT_EQ(resident->decoded_frames(), ragged.size());
  resident->reset_count();
  resident->region_reduce(g, block, RegionReduce::max);
  EXPECT_EQ(resident->decoded_frames(), block.size());
}

TEST(TileSums, AOneTileScanIsSkippedAndACancelledBuildKeepsNoTable) {
  const auto small = std::make_shared<CountingResident>(
      cpu_resident(random_case("small", DType::uint16, 16, 9, 3, 3, 2, 100, 0, 0)));
  backend::build_tile_sums(small);
  EXPECT_EQ(small->tile_sums().state(), TileSumsState::skipped);
  EXPECT_EQ(small->tile_sums().bytes(), 0u);

  const DenseCase c = grid_case();
  const auto resident = std::make_shared<CountingResident>(cpu_resident(c));
  resident->tile_sums().cancel();
  backend::build_tile_sums(resident);
  EXPECT_EQ(resident->tile_sums().state(), TileSumsState::cancelled);
  EXPECT_FALSE(resident->tile_sums().table());
  const plan::PlanGeometry g = geometry(c, {0, 33, 0, 33}, 1, 1);
  EXPECT_EQ(resident->pattern_sum(g), cpu_resident(c)->pattern_sum(g));
}

TEST(TileSumsBuilder, BuildsInTheBackgroundUnderTheComputeLockAndSurvivesADroppedResident) {
  const DenseCase c = grid_case();
  backend::TileSumsBuilder builder;
  std::mutex compute;
  std::unique_lock<std::mutex> held(compute);
  auto dropped = std::make_shared<CountingResident>(cpu_resident(c));
  const auto kept = std::make_shared<CountingResident>(cpu_resident(c));
  const auto lock = [&compute] { return std::unique_lock<std::mutex>(compute); };
  builder.submit(dropped, lock);
  builder.submit(kept, lock);
  // The first build waits for the compute lock: nothing is summed while a request holds it.
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(dropped->decoded_frames(), 0u);
  EXPECT_EQ(kept->tile_sums().state(), TileSumsState::queued);
  // Evicted while its build waits: the builder's weak hold ends the build.
  const std::weak_ptr<CountingResident> watch = dropped;
  dropped.reset();
  held.unlock();
  EXPECT_EQ(kept->tile_sums().wait_settled(10s), TileSumsState::ready);
  EXPECT_TRUE(watch.expired());
  const plan::PlanGeometry g = geometry(c, {1, 36, 2, 35}, 1, 2);
  EXPECT_EQ(kept->pattern_sum(g), cpu_resident(c)->pattern_sum(g));
}

TEST(TileSumsBuilder, ShutdownCancelsQueuedBuildsAndLaterSubmits) {
  const DenseCase c = grid_case();
  auto builder = std::make_unique<backend::TileSumsBuilder>();
  std::mutex compute;
  std::unique_lock<std::mutex> held(compute);
  const auto lock = [&compute] { return std::unique_lock<std::mutex>(compute); };
  const auto running = std::make_shared<CountingResident>(cpu_resident(c));
  const auto queued = std::make_shared<CountingResident>(cpu_resident(c));
  builder->submit(running, lock);
  builder->submit(queued, lock);
  std::this_thread::sleep_for(20ms);
  std::thread stop([&] { builder->shutdown(); });
  std::this_thread::sleep_for(20ms);
  held.unlock();  // the running build finishes its tile, sees the cancel and stops
  stop.join();
  EXPECT_EQ(running->tile_sums().state(), TileSumsState::cancelled);
  EXPECT_EQ(queued->tile_sums().state(), TileSumsState::cancelled);
  EXPECT_FALSE(running->tile_sums().table());
  const auto late = std::make_shared<CountingResident>(cpu_resident(c));
  builder->submit(late, lock);
  EXPECT_EQ(late->tile_sums().state(), TileSumsState::cancelled);
}

}  // namespace quantem::test
