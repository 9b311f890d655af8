// The AVX2 shuffle and unshuffle kernels (32 groups per step). This file alone is compiled
// with -mavx2; bitshuffle.cpp calls it only when the CPU reports AVX2.
#include <cstddef>
#include <cstdint>

#include "bitshuffle_simd.hpp"

namespace quantem::codec::detail {

std::size_t unshuffle_group_runs_avx2(const std::uint8_t* in, std::uint8_t* out, std::size_t groups,
                                      std::size_t element_size, std::size_t first_group) {
  return unshuffle_group_runs<Avx2Ops>(in, out, groups, element_size, first_group);
}

std::size_t shuffle_group_runs_avx2(const std::uint8_t* in, std::uint8_t* out, std::size_t groups,
                                    std::size_t element_size, std::size_t first_group) {
  return shuffle_group_runs<Avx2Ops>(in, out, groups, element_size, first_group);
}

}  // namespace quantem::codec::detail
