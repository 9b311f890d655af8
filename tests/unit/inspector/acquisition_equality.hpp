#pragma once
// Field-by-field comparison of two Acquisitions, for gtest, generated from the
// field table (catalog/acquisition_fields.hpp): a failure names the field.
#include <gtest/gtest.h>

#include "quantem/catalog/acquisition.hpp"
#include "quantem/catalog/acquisition_fields.hpp"

namespace quantem::test {

struct ExpectSameFields {
  template <typename T>
  void operator()(const char* name, const T& a, const T& b) {
    if constexpr (catalog::has_fields_v<T>) {
      catalog::for_each_field(*this, a, b);
    } else if constexpr (catalog::is_record_list_v<T>) {
      ASSERT_EQ(a.size(), b.size()) << name;
      for (std::size_t i = 0; i < a.size(); ++i) {
        SCOPED_TRACE(std::string(name) + "[" + std::to_string(i) + "]");
        catalog::for_each_field(*this, a[i], b[i]);
      }
    } else {
      EXPECT_EQ(a, b) << name;
    }
  }
};

inline void expect_same_acquisition(const catalog::Acquisition& a, const catalog::Acquisition& b) {
  ExpectSameFields compare;
  catalog::for_each_field(compare, a, b);
}

}  // namespace quantem::test
