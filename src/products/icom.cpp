#include "icom.hpp"

#include <fftw3.h>

#include <complex>
#include <memory>
#include <mutex>
#include <string>

#include "quantem/core/error.hpp"

namespace quantem::products {
namespace {

// FFTW's planner is not thread-safe; executing distinct plans is.
std::mutex& planner_mutex() {
  static std::mutex mutex;
  return mutex;
}

struct FftwFree {
  void operator()(void* memory) const noexcept { fftw_free(memory); }
};
using ComplexBuffer = std::unique_ptr<fftw_complex[], FftwFree>;

ComplexBuffer allocate_complex(std::size_t count) {
  auto* memory = static_cast<fftw_complex*>(fftw_malloc(sizeof(fftw_complex) * count));
  if (memory == nullptr) throw std::bad_alloc();
  return ComplexBuffer(memory);
}

// An in-place 2-D transform, destroyed under the planner lock.
class Plan2d {
 public:
  Plan2d(int rows, int cols, fftw_complex* data, int sign) {
    std::lock_guard<std::mutex> lock(planner_mutex());
    plan_ = fftw_plan_dft_2d(rows, cols, data, data, sign, FFTW_ESTIMATE);
    if (plan_ == nullptr) throw internal_error("FFTW could not plan a " + std::to_string(rows) + " x " +
                                               std::to_string(cols) + " transform");
  }
  ~Plan2d() {
    std::lock_guard<std::mutex> lock(planner_mutex());
    fftw_destroy_plan(plan_);
  }
  Plan2d(const Plan2d&) = delete;
  Plan2d& operator=(const Plan2d&) = delete;
  void execute(fftw_complex* data) const { fftw_execute_dft(plan_, data, data); }

 private:
  fftw_plan plan_ = nullptr;
};

// numpy.fft.fftfreq(n)[k]: k/n for k < ceil(n/2), else (k − n)/n.
double fftfreq(std::uint64_t k, std::uint64_t n) {
  const std::int64_t signed_k = k < (n + 1) / 2 ? static_cast<std::int64_t>(k)
                                                : static_cast<std::int64_t>(k) - static_cast<std::int64_t>(n);
  return static_cast<double>(signed_k) / static_cast<double>(n);
}

}  // namespace

std::vector<float> integrate_center_of_mass(const std::vector<float>& com_row, const std::vector<float>& com_col,
                                            std::uint64_t scan_rows, std::uint64_t scan_cols) {
  const std::uint64_t count = scan_rows * scan_cols;
  if (com_row.size() != count || com_col.size() != count || count == 0) {
    throw internal_error("iCoM: CoM maps do not match the " + std::to_string(scan_rows) + " x " +
                         std::to_string(scan_cols) + " scan");
  }
  ComplexBuffer gradient_row = allocate_complex(count);
  ComplexBuffer gradient_col = allocate_complex(count);
  for (std::uint64_t p = 0; p < count; ++p) {
    gradient_row[p][0] = com_row[p];
    gradient_row[p][1] = 0.0;
    gradient_col[p][0] = com_col[p];
    gradient_col[p][1] = 0.0;
  }
  const Plan2d forward(static_cast<int>(scan_rows), static_cast<int>(scan_cols), gradient_row.get(), FFTW_FORWARD);
  forward.execute(gradient_row.get());
  forward.execute(gradient_col.get());

  // Φ = (−0.25 i)(ν_r G_r + ν_c G_c) / k², written over gradient_row.
  const std::complex<double> minus_quarter_i(0.0, -0.25);
  for (std::uint64_t r = 0; r < scan_rows; ++r) {
    const double nu_row = fftfreq(r, scan_rows);
    for (std::uint64_t c = 0; c < scan_cols; ++c) {
      const std::uint64_t p = r * scan_cols + c;
      const double nu_col = fftfreq(c, scan_cols);
      const double k_squared = p == 0 ? 1.0 : nu_row * nu_row + nu_col * nu_col;
      const std::complex<double> g_row(gradient_row[p][0], gradient_row[p][1]);
      const std::complex<double> g_col(gradient_col[p][0], gradient_col[p][1]);
      const std::complex<double> phase = p == 0 ? 0.0 : minus_quarter_i * (nu_row * g_row + nu_col * g_col) / k_squared;
      gradient_row[p][0] = phase.real();
      gradient_row[p][1] = phase.imag();
    }
  }
  const Plan2d backward(static_cast<int>(scan_rows), static_cast<int>(scan_cols), gradient_row.get(), FFTW_BACKWARD);
  backward.execute(gradient_row.get());

  // numpy's ifft2 divides by the number of points; FFTW does not.
  const double scale = 1.0 / static_cast<double>(count);
  std::vector<double> phase(count);
  double sum = 0.0;
  for (std::uint64_t p = 0; p < count; ++p) {
    phase[p] = gradient_row[p][0] * scale;
    sum += phase[p];
  }
  const double mean = sum / static_cast<double>(count);
  std::vector<float> result(count);
  for (std::uint64_t p = 0; p < count; ++p) result[p] = static_cast<float>(-(phase[p] - mean));
  return result;
}

}  // namespace quantem::products
