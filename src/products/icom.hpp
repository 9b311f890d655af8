#pragma once
// Internal: Fourier integration of the CoM field (docs/protocol.md, 'Products', "iCoM";
// dpc.integrate of the Python service), in float64 with FFTW.
#include <cstdint>
#include <vector>

namespace quantem::products {

// g_r = CoMy, g_c = CoMx (row-major scan_rows x scan_cols). With ν = fftfreq,
// k² = ν_r² + ν_c² (k²[0,0] = 1), Φ = (−0.25 i)(ν_r·FFT2(g_r) + ν_c·FFT2(g_c)) / k²,
// Φ[0,0] = 0, φ = Re(IFFT2(Φ)); returns float32(−(φ − mean(φ))).
std::vector<float> integrate_center_of_mass(const std::vector<float>& com_row, const std::vector<float>& com_col,
                                            std::uint64_t scan_rows, std::uint64_t scan_cols);

}  // namespace quantem::products
