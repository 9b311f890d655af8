// The explicit CPU backend: virtual devices with their own budgets, and a
// loader that turns an acquisition's stored chunks into one CpuResident with
// a few large preads per thread against a prebuilt frame index.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "cpu/cpu_resident.hpp"
#include "cpu/cpu_load_plan.hpp"
#include "quantem/backend/thread_pool.hpp"
#include "quantem/backend/backend.hpp"
#include "quantem/backend/cpu_backend.hpp"
#include "quantem/catalog/acquisition.hpp"
#include "quantem/backend/shard_reader.hpp"
#include "quantem/core/error.hpp"

namespace quantem::backend {
namespace {

std::uint64_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page_size);
}

std::optional<std::uint64_t> available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  std::uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return std::nullopt;
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& options)
      : pool_(std::make_shared<ThreadPool>(options.threads)) {
    if (options.virtual_devices < 1) throw bad_request("the CPU backend needs at least one virtual device");
    const std::uint64_t physical = physical_memory_bytes();
    if (!(options.budget_fraction > 0.0 && options.budget_fraction <= 1.0)) {
      throw bad_request("the CPU device budget fraction must be in (0, 1]");
    }
    const bool by_fraction = options.budget_bytes_per_device == 0;
    const std::uint64_t budget =
        by_fraction ? static_cast<std::uint64_t>(static_cast<double>(physical) * options.budget_fraction) /
                          static_cast<std::uint64_t>(options.virtual_devices)
                    : options.budget_bytes_per_device;
    for (int i = 0; i < options.virtual_devices; ++i) {
      devices_.push_back({i, "CPU virtual device " + std::to_string(i), physical, budget,
                          by_fraction ? options.budget_fraction : 0.0});
    }
  }

  std::string name() const override { return "cpu"; }
  bool budgets_host_memory() const override { return true; }
  std::vector<DeviceInfo> devices() const override { return devices_; }

  // Every virtual device draws on the same host memory: this is the host's MemAvailable.
  std::optional<std::uint64_t> free_bytes(int device_index) const override {
    check_device(device_index);
    return available_memory_bytes();
  }

  LoadEstimate estimate_load(const catalog::Acquisition& acquisition) const override {
    check_loadable_shape(acquisition, cpu::kMaxDetectorAxis, name());
    const cpu::LoadPlan plan = cpu::plan_load(acquisition, pool_->size());
    return {plan.resident_bytes, plan.transition_peak_bytes, plan.max_transition_peak_bytes};
  }

  using Backend::load;
  std::shared_ptr<Resident> load(const catalog::Acquisition& acquisition, int device_index, LoadProgress& progress,
                                 LoadReservation& reservation) override {
    check_device(device_index);
    return run_load(acquisition, progress, cpu::kMaxDetectorAxis, name(),
                    "load " + acquisition.name + " on CPU virtual device " + std::to_string(device_index),
                    [&] { return load_checked(acquisition, device_index, progress, reservation); });
  }

 private:
  void check_device(int device_index) const {
    if (device_index < 0 || device_index >= static_cast<int>(devices_.size())) {
      throw bad_request("no CPU virtual device " + std::to_string(device_index) + " (the backend has " +
                        std::to_string(devices_.size()) + ")");
    }
  }

  // Reservation: admission reserved the first pass (plan.transition_peak_bytes).
  // A uint32 source that needs 32-bit codes grows it by the wide pass's extra
  // bytes after the first pass is freed and before the second allocates; the
  // staging buffers are handed back once freed.
  //
  // Order: the groups holding progress.first_rows first (with
  // progress.first_columns, the window's groups before the rest of those
  // rows), then the others (cpu::GroupOrder). When progress.rows_held is set, the resident is
  // published as its rows become whole, except in a uint32 source's first pass
  // (its codes may yet be rebuilt wider).
  std::shared_ptr<Resident> load_checked(const catalog::Acquisition& acquisition, int device_index,
                                         LoadProgress& progress, LoadReservation& reservation) {
    const cpu::LoadPlan plan = cpu::plan_load(acquisition, pool_->size());
    const std::shared_ptr<const catalog::FrameIndex> kept_index = frame_index(acquisition);
    const catalog::FrameIndex& index = *kept_index;
    const std::vector<cpu::ReadBatch> batches = cpu::plan_reads(acquisition, index, plan);
    ShardFiles files(index.shard_paths);

    std::uint64_t bytes_total = 0;
    for (const cpu::ReadBatch& batch : batches) bytes_total += batch.stored_bytes;
    progress.bytes_total = bytes_total;
    progress.stage = LoadStage::decoding;

    // Each frame group's batches are consecutive: group g reads batches [first_batch[g], first_batch[g + 1]).
    const std::uint64_t groups = cpu::ResidentBuilder::group_count(acquisition);
    std::vector<std::size_t> first_batch(groups + 1, batches.size());
    for (std::size_t b = batches.size(); b-- > 0;) first_batch[batches[b].first_frame / cpu::kGroupFrames] = b;
    for (std::uint64_t g = groups; g-- > 0;) first_batch[g] = std::min(first_batch[g], first_batch[g + 1]);

    const std::uint64_t pixels = acquisition.frame_pixels();
    const std::size_t element = dtype_size(*acquisition.dtype);
    DType code_dtype = cpu::ResidentBuilder::initial_code_dtype(*acquisition.dtype);
    const std::uint64_t staging_bytes = plan.staging_bytes();
    for (;;) {
      progress.bytes_done = 0;
      try {
        cpu::ResidentBuilder builder(acquisition, code_dtype, pool_, device_index);
        cpu::GroupOrder order(acquisition, progress.first_rows, progress.first_columns);
        // Codes of the source's own width are never rebuilt.
        const bool publishes = progress.rows_held && code_dtype == *acquisition.dtype;
        HeldRows& held = builder.resident()->held_rows();
        if (publishes) held.begin(acquisition.scan_rows, progress.first_rows.value_or(ScanRows{}));
        std::vector<std::vector<std::uint8_t>> staging(pool_->size());
        pool_->parallel_for(groups, 1, [&](std::size_t begin, std::size_t end, unsigned who) {
          std::vector<std::uint8_t>& buffer = staging[who];
          if (buffer.size() < plan.staging_bytes_per_thread) buffer.resize(plan.staging_bytes_per_thread);
          for (std::size_t n = begin; n < end; ++n) {
            if (progress.cancel_requested) throw LoadCancelled{};
            const std::uint64_t group = order.group_at(n);
            std::uint64_t group_stored_bytes = 0;
            for (std::size_t b = first_batch[group]; b < first_batch[group + 1]; ++b) {
              const cpu::ReadBatch& batch = batches[b];
              read_exactly(files.fd(batch.shard), buffer.data(), batch.bytes, batch.file_offset,
                           index.shard_paths[batch.shard], batch.first_frame);
              for (std::uint64_t frame = batch.first_frame; frame < batch.first_frame + batch.frame_count; ++frame) {
                const catalog::FrameLocation& location = index.frames[frame];
                decode_stored_frame(acquisition, index, frame,
                                    buffer.data() + (location.file_offset - batch.file_offset),
                                    builder.decode_target(frame, who), pixels * element);
                builder.finish_frame(frame, who);
              }
              group_stored_bytes += batch.stored_bytes;
            }
            builder.finish_group(group, who);
            progress.bytes_done += group_stored_bytes;
            if (publishes) publish_rows(order, group, held, builder.resident(), progress);
          }
        });
        staging.clear();
        staging.shrink_to_fit();
        reservation.release(std::min(staging_bytes, reservation.reserved_bytes()));
        std::shared_ptr<Resident> resident = builder.finish();
        held.hold_all();
        return resident;
      } catch (const cpu::NeedsWideCodes&) {
        code_dtype = DType::uint32;  // a masked count above 65535: hold 32-bit codes, exactly
        // The first pass is freed (the builder left scope); reserve the wider one before it allocates.
        if (progress.cancel_requested) throw LoadCancelled{};
        reservation.grow(plan.wide_pass_growth_bytes);
      }
    }
  }

  // After a group is built: when more rows of the load's order are whole,
  // they are held and the resident is handed to progress.rows_held (one call
  // at a time: under the order's lock). The order's last row waits for
  // hold_all() after builder.finish(): a plan holding every row may be
  // uncropped, and reads the pattern sum that finish() fills.
  // A window-first load's window is held (and published) as soon as its last group is built.
  static void publish_rows(cpu::GroupOrder& order, std::uint64_t group, HeldRows& held,
                           const std::shared_ptr<cpu::CpuResident>& resident, LoadProgress& progress) {
    order.finish_group(
        group, held,
        [&](std::uint64_t whole_rows) {
          const std::uint64_t rows = std::min(whole_rows, held.total() - 1);
          if (rows <= held.held()) return;
          held.hold(rows);
          progress.rows_held(resident);
        },
        [&] {
          held.hold_window(*order.window_columns());
          progress.rows_held(resident);
        });
  }

  std::shared_ptr<ThreadPool> pool_;
  std::vector<DeviceInfo> devices_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace quantem::backend
