#pragma once
// Field-by-field comparison of two Acquisitions, for gtest.
#include <gtest/gtest.h>

#include "quantem/catalog/acquisition.hpp"

namespace quantem::test {

inline void expect_same_acquisition(const catalog::Acquisition& a, const catalog::Acquisition& b) {
  EXPECT_EQ(a.master_path, b.master_path);
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.stem, b.stem);
  EXPECT_EQ(a.scan_rows, b.scan_rows);
  EXPECT_EQ(a.scan_cols, b.scan_cols);
  EXPECT_EQ(a.detector_rows, b.detector_rows);
  EXPECT_EQ(a.detector_cols, b.detector_cols);
  EXPECT_EQ(a.scan_shape_basis, b.scan_shape_basis);
  EXPECT_EQ(a.dtype, b.dtype);
  EXPECT_EQ(a.chunk_format.filter, b.chunk_format.filter);
  EXPECT_EQ(a.chunk_format.element_size, b.chunk_format.element_size);
  ASSERT_EQ(a.shards.size(), b.shards.size());
  for (std::size_t i = 0; i < a.shards.size(); ++i) {
    EXPECT_EQ(a.shards[i].link_name, b.shards[i].link_name);
    EXPECT_EQ(a.shards[i].file_path, b.shards[i].file_path);
    EXPECT_EQ(a.shards[i].dataset_path, b.shards[i].dataset_path);
    EXPECT_EQ(a.shards[i].external, b.shards[i].external);
    EXPECT_EQ(a.shards[i].exists, b.shards[i].exists);
    EXPECT_EQ(a.shards[i].frame_count, b.shards[i].frame_count);
  }
  EXPECT_EQ(a.stored_frames, b.stored_frames);
  EXPECT_EQ(a.expected_frames, b.expected_frames);
  EXPECT_EQ(a.ntrigger, b.ntrigger);
  EXPECT_EQ(a.nimages, b.nimages);
  EXPECT_EQ(a.pixel_mask, b.pixel_mask);
  EXPECT_EQ(a.masked_pixel_count, b.masked_pixel_count);
  EXPECT_EQ(a.size_bytes, b.size_bytes);
  EXPECT_EQ(a.status.loadable, b.status.loadable);
  EXPECT_EQ(a.status.reason, b.status.reason);
  EXPECT_EQ(a.status.action, b.status.action);
  EXPECT_EQ(a.scan_sampling_A, b.scan_sampling_A);
  EXPECT_EQ(a.k_pixel_size_mrad, b.k_pixel_size_mrad);
  EXPECT_EQ(a.signature, b.signature);
}

}  // namespace quantem::test
