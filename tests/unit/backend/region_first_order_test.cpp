// The orders of a region-first load: HeldRows (which scan rows a resident
// published before its load ends holds) and cpu::GroupOrder (which frame
// groups a CPU load builds first, and which rows are whole as groups finish
// in any order). Both are checked against orders written out row by row here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_resident.hpp"
#include "cpu/cpu_load_plan.hpp"
#include "quantem/backend/backend.hpp"
#include "quantem/catalog/acquisition.hpp"

namespace quantem::backend {
namespace {

// The load's order written out: the first rows (clamped to the scan), then
// the rows above them, then the rows below them; an empty range is ascending.
std::vector<std::uint64_t> expected_row_order(std::uint64_t scan_rows, ScanRows first) {
  const std::uint64_t end = std::min(first.end, scan_rows);
  const std::uint64_t begin = std::min(first.first, end);
  std::vector<std::uint64_t> order;
  for (std::uint64_t r = begin; r < end; ++r) order.push_back(r);
  for (std::uint64_t r = 0; r < scan_rows; ++r) {
    if (r < begin || r >= end) order.push_back(r);
  }
  return order;
}

// Every row of [rows.first, rows.end) (cut at the scan) is among the first `held` of `order`.
bool expected_holds(const std::vector<std::uint64_t>& order, std::uint64_t held, ScanRows rows) {
  for (std::uint64_t r = rows.first; r < std::min<std::uint64_t>(rows.end, order.size()); ++r) {
    const auto at = std::find(order.begin(), order.end(), r);
    if (static_cast<std::uint64_t>(at - order.begin()) >= held) return false;
  }
  return true;
}

std::string describe(std::uint64_t scan_rows, ScanRows first, std::uint64_t held) {
  return "scan " + std::to_string(scan_rows) + " rows, first [" + std::to_string(first.first) + ", " +
         std::to_string(first.end) + "), " + std::to_string(held) + " held";
}

TEST(HeldRows, ADefaultOneHoldsEveryRow) {
  const HeldRows held;
  EXPECT_TRUE(held.holds_all());
  EXPECT_EQ(held.total(), 0u);
  EXPECT_TRUE(held.holds({0, 1}));
  EXPECT_TRUE(held.holds({5, 100000}));
  EXPECT_TRUE(held.holds({0, ~std::uint64_t{0}}));
}

TEST(ScanRows, OfAPlanAreItsRegionRows) {
  plan::PlanGeometry geometry;
  geometry.region = {3, 9, 1, 4};
  EXPECT_EQ(scan_rows_of(geometry), (ScanRows{3, 9}));
  EXPECT_EQ((ScanRows{7, 3}).count(), 0u);
  EXPECT_EQ((ScanRows{3, 7}).count(), 4u);
}

// Every position of the first rows (before, inside, after the scan, at its
// edges, empty anywhere), every count held, every range asked about
// (including ranges spanning the first rows and the rows above and below).
TEST(HeldRows, OrderAndHoldsMatchTheOrderWrittenOut) {
  for (std::uint64_t scan_rows = 1; scan_rows <= 7; ++scan_rows) {
    for (std::uint64_t first_begin = 0; first_begin <= scan_rows + 2; ++first_begin) {
      for (std::uint64_t first_end = 0; first_end <= scan_rows + 2; ++first_end) {
        const ScanRows first{first_begin, first_end};
        const std::vector<std::uint64_t> order = expected_row_order(scan_rows, first);
        HeldRows held;
        held.begin(scan_rows, first);
        EXPECT_EQ(held.total(), scan_rows);
        for (std::uint64_t n = 0; n < scan_rows; ++n) {
          ASSERT_EQ(held.row_at(n), order[n]) << describe(scan_rows, first, 0) << ", position " << n;
        }
        for (std::uint64_t count = 0; count <= scan_rows; ++count) {
          held.hold(count);
          ASSERT_EQ(held.held(), count) << describe(scan_rows, first, count);
          ASSERT_EQ(held.holds_all(), count == scan_rows) << describe(scan_rows, first, count);
          for (std::uint64_t a = 0; a <= scan_rows + 1; ++a) {
            for (std::uint64_t b = 0; b <= scan_rows + 2; ++b) {
              ASSERT_EQ(held.holds({a, b}), expected_holds(order, count, {a, b}))
                  << describe(scan_rows, first, count) << ", asked [" << a << ", " << b << ")";
            }
          }
        }
      }
    }
  }
}

TEST(HeldRows, HoldNeverGoesBackAndStopsAtTheScan) {
  HeldRows held;
  held.begin(10, {4, 6});
  EXPECT_FALSE(held.holds_all());
  EXPECT_EQ(held.held(), 0u);
  EXPECT_FALSE(held.holds({4, 5}));
  held.hold(2);
  EXPECT_TRUE(held.holds({4, 6}));
  EXPECT_FALSE(held.holds({3, 6}));
  held.hold(1);  // smaller: ignored
  EXPECT_EQ(held.held(), 2u);
  held.hold(2);
  EXPECT_EQ(held.held(), 2u);
  held.hold(6);  // the first rows, then rows 0..3
  EXPECT_TRUE(held.holds({0, 6}));
  EXPECT_FALSE(held.holds({5, 7}));
  held.hold(1000);  // clamped to the scan
  EXPECT_EQ(held.held(), 10u);
  EXPECT_TRUE(held.holds_all());
  held.hold(3);
  EXPECT_TRUE(held.holds_all());
  // begin() starts a load over: nothing held.
  held.begin(10, {});
  EXPECT_EQ(held.held(), 0u);
  EXPECT_FALSE(held.holds({0, 1}));
  held.hold_all();
  EXPECT_TRUE(held.holds_all());
  EXPECT_TRUE(held.holds({0, 10}));
}

// --- cpu::GroupOrder ---------------------------------------------------------

catalog::Acquisition scan_of(std::uint64_t scan_rows, std::uint64_t scan_cols) {
  catalog::Acquisition acquisition;
  acquisition.scan_rows = scan_rows;
  acquisition.scan_cols = scan_cols;
  acquisition.detector_rows = 4;
  acquisition.detector_cols = 4;
  return acquisition;
}

constexpr std::uint64_t kGroup = cpu::kGroupFrames;

std::uint64_t group_count_of(std::uint64_t scan_rows, std::uint64_t scan_cols) {
  return (scan_rows * scan_cols + kGroup - 1) / kGroup;
}

// Whether frame group g (frames [32 g, 32 g + 32)) holds a frame of row r.
bool group_holds_row(std::uint64_t g, std::uint64_t r, std::uint64_t scan_cols) {
  const std::uint64_t row_first = r * scan_cols, row_end = (r + 1) * scan_cols;
  return g * kGroup < row_end && (g + 1) * kGroup > row_first;
}

// The groups holding a frame of the first rows, ascending, then the others ascending.
std::vector<std::uint64_t> expected_group_order(std::uint64_t scan_rows, std::uint64_t scan_cols,
                                                std::optional<ScanRows> first) {
  const std::uint64_t groups = group_count_of(scan_rows, scan_cols);
  std::vector<bool> early(groups, false);
  if (first) {
    for (std::uint64_t r = first->first; r < std::min(first->end, scan_rows); ++r) {
      for (std::uint64_t g = 0; g < groups; ++g) early[g] = early[g] || group_holds_row(g, r, scan_cols);
    }
  }
  std::vector<std::uint64_t> order;
  for (std::uint64_t g = 0; g < groups; ++g) {
    if (early[g]) order.push_back(g);
  }
  for (std::uint64_t g = 0; g < groups; ++g) {
    if (!early[g]) order.push_back(g);
  }
  return order;
}

std::vector<std::uint64_t> group_order_of(const cpu::GroupOrder& order) {
  std::vector<std::uint64_t> groups;
  for (std::uint64_t n = 0; n < order.groups(); ++n) groups.push_back(order.group_at(n));
  return groups;
}

struct Shape {
  std::uint64_t rows;
  std::uint64_t cols;
};

// Scan widths not a multiple of 32, narrower than a group, exactly one group.
const std::vector<Shape> kShapes = {{9, 37}, {12, 10}, {7, 5}, {6, 32}, {5, 64}, {1, 45}, {11, 33}};

TEST(GroupOrder, BuildsTheGroupsOfTheFirstRowsFirstThenTheRestAscending) {
  for (const Shape& shape : kShapes) {
    const catalog::Acquisition acquisition = scan_of(shape.rows, shape.cols);
    std::vector<std::optional<ScanRows>> firsts = {std::nullopt, ScanRows{}, ScanRows{0, 1}, ScanRows{0, 2},
                                                   ScanRows{shape.rows / 2, shape.rows / 2 + 1},
                                                   ScanRows{shape.rows / 2, shape.rows / 2},
                                                   ScanRows{shape.rows - 1, shape.rows},
                                                   ScanRows{shape.rows - 1, shape.rows + 5},
                                                   ScanRows{shape.rows + 2, shape.rows + 4}, ScanRows{0, shape.rows}};
    if (shape.rows > 3) firsts.push_back(ScanRows{1, shape.rows - 1});
    for (const auto& first : firsts) {
      const cpu::GroupOrder order(acquisition, first);
      const std::string where = std::to_string(shape.rows) + "x" + std::to_string(shape.cols) + " first " +
                                (first ? std::to_string(first->first) + ".." + std::to_string(first->end) : "none");
      EXPECT_EQ(group_order_of(order), expected_group_order(shape.rows, shape.cols, first)) << where;
      EXPECT_EQ(order.groups(), group_count_of(shape.rows, shape.cols)) << where;
    }
  }
}

// Rows of the load's order that are whole (every group holding a frame of
// them built), counted from the start of the order.
std::uint64_t expected_whole_rows(const std::vector<std::uint64_t>& row_order, const std::vector<bool>& built,
                                  std::uint64_t scan_cols) {
  std::uint64_t whole = 0;
  for (const std::uint64_t row : row_order) {
    for (std::uint64_t g = 0; g < built.size(); ++g) {
      if (group_holds_row(g, row, scan_cols) && !built[g]) return whole;
    }
    ++whole;
  }
  return whole;
}

// Groups finished in the load's order and in shuffled orders: each report is
// the count of whole rows of the order, only when it grew, and the count
// reaches every row once every group is built.
TEST(GroupOrder, RowsAreWholeOnlyWhenEveryGroupHoldingOneOfTheirFramesIsBuilt) {
  std::mt19937_64 random(7);
  for (const Shape& shape : kShapes) {
    const catalog::Acquisition acquisition = scan_of(shape.rows, shape.cols);
    const std::vector<ScanRows> firsts = {ScanRows{}, ScanRows{0, 1}, ScanRows{shape.rows / 2, shape.rows / 2 + 2},
                                          ScanRows{shape.rows - 1, shape.rows}};
    for (const ScanRows& first : firsts) {
      for (int shuffle = 0; shuffle < 6; ++shuffle) {
        cpu::GroupOrder order(acquisition, first);
        HeldRows held;
        held.begin(shape.rows, first);
        const std::vector<std::uint64_t> row_order = expected_row_order(shape.rows, first);
        std::vector<std::uint64_t> finish = group_order_of(order);
        if (shuffle > 0) std::shuffle(finish.begin(), finish.end(), random);
        std::vector<bool> built(finish.size(), false);
        std::uint64_t reported = 0;
        for (const std::uint64_t group : finish) {
          built[group] = true;
          const std::uint64_t want = expected_whole_rows(row_order, built, shape.cols);
          const std::uint64_t before = reported;
          bool called = false;
          order.finish_group(group, held, [&](std::uint64_t whole) {
            EXPECT_FALSE(called) << "one report per finished group";
            called = true;
            EXPECT_GT(whole, reported);
            reported = whole;
          });
          const std::string where = std::to_string(shape.rows) + "x" + std::to_string(shape.cols) + " first [" +
                                    std::to_string(first.first) + ", " + std::to_string(first.end) + ") shuffle " +
                                    std::to_string(shuffle) + " group " + std::to_string(group);
          ASSERT_EQ(reported, want) << where;
          ASSERT_EQ(called, want > before) << where;  // a report only when more rows are whole
          held.hold(reported);
          // The rows the order says are whole are those held: each of their groups is built.
          for (std::uint64_t n = 0; n < reported; ++n) {
            for (std::uint64_t g = 0; g < built.size(); ++g) {
              if (group_holds_row(g, held.row_at(n), shape.cols)) {
                ASSERT_TRUE(built[g]) << where;
              }
            }
          }
        }
        EXPECT_EQ(reported, shape.rows);
      }
    }
  }
}

// The first rows of a middle band become whole before any other group is
// built: a request for them need not wait for the rest of the scan.
TEST(GroupOrder, AMiddleBandIsWholeOnceItsOwnGroupsAreBuilt) {
  const catalog::Acquisition acquisition = scan_of(12, 37);
  const ScanRows band{5, 8};  // frames 185..295: groups 5..9
  cpu::GroupOrder order(acquisition, band);
  HeldRows held;
  held.begin(12, band);
  ASSERT_EQ(order.group_at(0), 5u);
  ASSERT_EQ(order.group_at(4), 9u);
  ASSERT_EQ(order.group_at(5), 0u);
  std::uint64_t reported = 0;
  for (std::uint64_t n = 0; n < 5; ++n) {
    order.finish_group(order.group_at(n), held, [&](std::uint64_t whole) { reported = whole; });
  }
  // Rows 5..7 are whole; row 4 (frames 148..184) also needs group 4.
  EXPECT_EQ(reported, 3u);
  held.hold(reported);
  EXPECT_TRUE(held.holds(band));
  EXPECT_FALSE(held.holds({4, 8}));
  EXPECT_FALSE(held.holds({5, 9}));
}

// ---- window-first: the first rows' window before the rest of those rows ----

// Whether frame group g holds a frame of the window rows x columns.
bool group_holds_window(std::uint64_t g, ScanRows rows, ScanColumns columns, std::uint64_t scan_cols) {
  for (std::uint64_t r = rows.first; r < rows.end; ++r) {
    const std::uint64_t first = r * scan_cols + columns.first, end = r * scan_cols + columns.end;
    if (g * kGroup < end && (g + 1) * kGroup > first) return true;
  }
  return false;
}

TEST(GroupOrder, AWindowsGroupsComeFirstAndItIsWholeOnceWhateverTheOrder) {
  for (const Shape& shape : {Shape{12, 100}, Shape{9, 37}, Shape{6, 64}, Shape{7, 5}}) {
    const catalog::Acquisition acquisition = scan_of(shape.rows, shape.cols);
    const ScanRows band{shape.rows / 3, shape.rows / 3 + 3};
    const ScanColumns columns{shape.cols / 3, shape.cols / 3 + std::max<std::uint64_t>(1, shape.cols / 4)};
    const std::string where = std::to_string(shape.rows) + "x" + std::to_string(shape.cols);
    cpu::GroupOrder order(acquisition, band, columns);
    ASSERT_TRUE(order.window_columns().has_value()) << where;
    const std::vector<std::uint64_t> groups = group_order_of(order);
    // The window's groups, then the band's other groups, then the rest, each ascending.
    std::vector<std::uint64_t> window, rest_of_band, others;
    for (std::uint64_t g = 0; g < group_count_of(shape.rows, shape.cols); ++g) {
      bool in_band = false;
      for (std::uint64_t r = band.first; r < band.end; ++r) in_band = in_band || group_holds_row(g, r, shape.cols);
      if (group_holds_window(g, band, columns, shape.cols)) {
        window.push_back(g);
      } else if (in_band) {
        rest_of_band.push_back(g);
      } else {
        others.push_back(g);
      }
    }
    std::vector<std::uint64_t> expected = window;
    expected.insert(expected.end(), rest_of_band.begin(), rest_of_band.end());
    expected.insert(expected.end(), others.begin(), others.end());
    EXPECT_EQ(groups, expected) << where;
    // Built in shuffled orders: the window is whole exactly once, at its last group.
    std::mt19937 random(7);
    for (int round = 0; round < 20; ++round) {
      cpu::GroupOrder shuffled(acquisition, band, columns);
      HeldRows held;
      held.begin(shape.rows, band);
      std::vector<std::uint64_t> build = groups;
      std::shuffle(build.begin(), build.end(), random);
      std::size_t window_left = window.size();
      int window_calls = 0;
      for (const std::uint64_t g : build) {
        if (std::find(window.begin(), window.end(), g) != window.end()) --window_left;
        shuffled.finish_group(g, held, [](std::uint64_t) {}, [&] {
          ++window_calls;
          EXPECT_EQ(window_left, 0u) << where << " group " << g;
        });
      }
      EXPECT_EQ(window_calls, 1) << where;
    }
  }
}

TEST(GroupOrder, AWindowOfEveryColumnOrOfNoColumnIsNoWindow) {
  const catalog::Acquisition acquisition = scan_of(9, 37);
  EXPECT_FALSE(cpu::GroupOrder(acquisition, ScanRows{2, 4}, ScanColumns{0, 37}).window_columns());
  EXPECT_FALSE(cpu::GroupOrder(acquisition, ScanRows{2, 4}, ScanColumns{0, 500}).window_columns());
  EXPECT_FALSE(cpu::GroupOrder(acquisition, ScanRows{2, 4}, ScanColumns{5, 5}).window_columns());
  EXPECT_FALSE(cpu::GroupOrder(acquisition, std::nullopt, ScanColumns{5, 9}).window_columns());
  EXPECT_EQ(group_order_of(cpu::GroupOrder(acquisition, ScanRows{2, 4}, ScanColumns{0, 37})),
            group_order_of(cpu::GroupOrder(acquisition, ScanRows{2, 4})));
}

TEST(HeldRows, AHeldWindowHoldsWhatLiesInsideItAndNothingElse) {
  HeldRows held;
  held.begin(10, ScanRows{4, 7});
  const ScanWindow inside{ScanRows{4, 7}, ScanColumns{10, 20}};
  EXPECT_FALSE(held.holds(inside));
  held.hold_window(ScanColumns{10, 20});
  EXPECT_TRUE(held.holds(inside));
  EXPECT_TRUE(held.holds(ScanWindow{ScanRows{5, 6}, ScanColumns{12, 13}}));
  EXPECT_FALSE(held.holds(ScanWindow{ScanRows{4, 7}, ScanColumns{9, 20}}));
  EXPECT_FALSE(held.holds(ScanWindow{ScanRows{4, 7}, ScanColumns{10, 21}}));
  EXPECT_FALSE(held.holds(ScanWindow{ScanRows{3, 7}, ScanColumns{10, 20}}));
  EXPECT_FALSE(held.holds(ScanWindow{ScanRows{4, 8}, ScanColumns{10, 20}}));
  EXPECT_FALSE(held.holds(ScanRows{4, 7}));  // every column of those rows: not yet
  EXPECT_FALSE(held.holds(ScanWindow{ScanRows{4, 7}}));
  held.hold(3);  // rows 4..6 whole: any columns of them
  EXPECT_TRUE(held.holds(ScanWindow{ScanRows{4, 7}}));
  EXPECT_TRUE(held.holds(ScanWindow{ScanRows{4, 7}, ScanColumns{0, 3}}));
  EXPECT_FALSE(held.holds(ScanWindow{ScanRows{3, 7}, ScanColumns{10, 20}}));
  held.hold_all();
  EXPECT_TRUE(held.holds(ScanWindow{ScanRows{0, 10}}));
}

}  // namespace
}  // namespace quantem::backend
