// The shared text helpers against hand-written expectations.
#include <gtest/gtest.h>

#include "quantem/core/text.hpp"

using quantem::base_name;
using quantem::iequals;
using quantem::to_lower;
using quantem::trim;

TEST(CoreText, TrimRemovesOnlyTheGivenCharactersAtBothEnds) {
  EXPECT_EQ(trim("  a b \t\n"), "a b");
  EXPECT_EQ(trim("\v\f\r x\r"), "x");
  EXPECT_EQ(trim("   "), "");
  EXPECT_EQ(trim(""), "");
  EXPECT_EQ(trim("\n x \n", quantem::kHttpWhitespace), "\n x \n");
  EXPECT_EQ(trim("\t x y  ", quantem::kHttpWhitespace), "x y");
}

TEST(CoreText, LowerAndCaseInsensitiveEqualityTouchOnlyAsciiLetters) {
  EXPECT_EQ(to_lower("Content-Type: ÄB"), "content-type: \xC3\x84" "b");
  EXPECT_TRUE(iequals("Keep-Alive", "keep-alive"));
  EXPECT_FALSE(iequals("keep-alive", "keep-alive "));
  EXPECT_FALSE(iequals("[", "{"));  // 0x5B and 0x7B differ by the case bit but are not letters
}

TEST(CoreText, BaseNameIsThePartAfterTheLastSlash) {
  EXPECT_EQ(base_name("/data/sess/a_master.h5"), "a_master.h5");
  EXPECT_EQ(base_name("a_master.h5"), "a_master.h5");
  EXPECT_EQ(base_name("/data/sess/"), "");
}
