#include "quantem/server/export_routes.hpp"

#include <chrono>
#include <filesystem>

#include <spdlog/spdlog.h>

#include "quantem/core/error.hpp"
#include "quantem/export/export.hpp"
#include "quantem/protocol/documents.hpp"
#include "quantem/protocol/requests.hpp"
#include "quantem/server/error_mapping.hpp"

namespace quantem::server {

const char* const kExportDisabledMessage =
    "exports are off: start the daemon with --export-dir FOLDER (an existing folder the daemon may write; every "
    "export is written below it as <name>/<name>_master.h5 with its data files)";

namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;
constexpr const char* kRoute = "/api/browse/export";

enum class JobState { queued, running, done, failed, cancelled };

const char* job_state_name(JobState state) {
  switch (state) {
    case JobState::queued: return "queued";
    case JobState::running: return "running";
    case JobState::done: return "done";
    case JobState::failed: return "failed";
    case JobState::cancelled: return "cancelled";
  }
  return "unknown";
}

// A job id as the routes name it (decimal); 0, never an id, when malformed.
std::uint64_t job_number(const std::string& id) {
  if (id.empty() || id.size() > 19 || id.find_first_not_of("0123456789") != std::string::npos) return 0;
  return std::stoull(id);
}

}  // namespace

struct ExportJobs::Job {
  std::string id;
  protocol::SourceRef source;
  catalog::Acquisition acquisition;
  exporter::ExportRequest request;
  exporter::ExportLayout layout;
  exporter::ExportProgress progress;
  Clock::time_point created = Clock::now();
  // Guarded by ExportJobs::mutex_.
  JobState state = JobState::queued;
  bool loading = false;
  std::optional<exporter::ExportReport> report;
  int error_status = 0;
  std::string error_detail;
  double elapsed_seconds = 0.0;
};

ExportJobs::ExportJobs(ExportJobsConfig config, residency::ResidencyManager& residency, CatalogService& catalog)
    : config_(std::move(config)), residency_(residency), catalog_(catalog) {
  if (!config_.export_dir.empty()) {
    const std::size_t removed = exporter::remove_abandoned_exports(config_.export_dir);
    if (removed) spdlog::info("export: removed {} incomplete exports of a daemon that died", removed);
    thread_ = std::thread([this] { run_jobs(); });
  }
}

ExportJobs::~ExportJobs() { shutdown(); }

void ExportJobs::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    for (auto& [id, job] : jobs_) job->progress.cancel_requested = true;
  }
  queued_.notify_all();
  if (thread_.joinable()) thread_.join();
}

bool ExportJobs::handles(const std::string& path) {
  const std::string route = kRoute;
  return path == route || (path.size() > route.size() + 1 && path.compare(0, route.size() + 1, route + "/") == 0);
}

HttpResponse ExportJobs::handle(const HttpRequest& request, const protocol::QueryParams& params) {
  if (config_.export_dir.empty()) throw conflict(kExportDisabledMessage);
  const std::string route = kRoute;
  if (request.path == route) {
    if (request.method == "POST") return start(params);
    if (request.method == "GET") return list();
    HttpResponse response = HttpResponse::detail(405, "Method Not Allowed");
    response.set_header("allow", "GET, POST");
    return response;
  }
  const std::string id = request.path.substr(route.size() + 1);
  if (request.method == "GET") return show(id);
  if (request.method == "DELETE") return cancel(id);
  HttpResponse response = HttpResponse::detail(405, "Method Not Allowed");
  response.set_header("allow", "GET, DELETE");
  return response;
}

HttpResponse ExportJobs::start(const protocol::QueryParams& params) {
  const protocol::ExportQuery query = protocol::parse_export_query(params);
  auto job = std::make_shared<Job>();
  job->source = query.source;
  job->acquisition = catalog_.resolve(query.source.session, query.source.file);
  if (!job->acquisition.status.loadable) throw conflict(job->acquisition.status.reason);
  job->request.plan = query.plan;
  job->request.output_folder = config_.export_dir;
  job->request.frames_per_file = static_cast<std::uint64_t>(query.frames_per_file);
  job->request.threads = config_.threads;
  job->request.implementation_revision = config_.implementation_revision;
  job->request.source_identity = protocol::signature_digest(job->acquisition.signature);
  exporter::check_export_folder(config_.export_dir);
  job->layout = exporter::plan_export(job->acquisition, job->request);
  const std::string final_folder = config_.export_dir + "/" + job->layout.name;
  std::error_code status_error;
  if (std::filesystem::symlink_status(final_folder, status_error).type() != std::filesystem::file_type::not_found) {
    throw conflict("the export " + final_folder + " already exists; an export never overwrites anything");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw unavailable("the daemon is shutting down");
    if (queue_.size() >= config_.max_queued_jobs) {
      throw unavailable("the export queue is full (" + std::to_string(queue_.size()) +
                        " exports wait; at most " + std::to_string(config_.max_queued_jobs) +
                        "): retry once one has finished");
    }
    for (const auto& [id, other] : jobs_) {
      if ((other->state == JobState::queued || other->state == JobState::running) &&
          other->layout.name == job->layout.name) {
        throw conflict("an export of " + job->layout.name + " is already " + job_state_name(other->state) +
                       " (job " + other->id + ")");
      }
    }
    const std::uint64_t number = next_id_++;
    job->id = std::to_string(number);
    jobs_[number] = job;
    queue_.push_back(job);
    forget_old_jobs_locked();
  }
  queued_.notify_all();
  spdlog::info("export {}: {} of {} queued", job->id, job->layout.name, job->acquisition.name);
  std::lock_guard<std::mutex> lock(mutex_);
  HttpResponse response = HttpResponse::json(202, document(*job));
  response.set_header("location", std::string(kRoute) + "/" + job->id);
  return response;
}

HttpResponse ExportJobs::show(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = jobs_.find(job_number(id));
  if (it == jobs_.end()) throw not_found("no export job " + id);
  return HttpResponse::json(200, document(*it->second));
}

HttpResponse ExportJobs::cancel(const std::string& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = jobs_.find(job_number(id));
  if (it == jobs_.end()) throw not_found("no export job " + id);
  Job& job = *it->second;
  job.progress.cancel_requested = true;
  if (job.state == JobState::queued) {
    job.state = JobState::cancelled;
    job.progress.stage = exporter::ExportStage::cancelled;
    for (auto q = queue_.begin(); q != queue_.end(); ++q) {
      if (q->get() == &job) {
        queue_.erase(q);
        break;
      }
    }
  }
  return HttpResponse::json(200, document(job));
}

HttpResponse ExportJobs::list() const {
  std::lock_guard<std::mutex> lock(mutex_);
  json jobs = json::array();
  for (const auto& [id, job] : jobs_) jobs.push_back(document(*job));
  return HttpResponse::json(200, {{"export_dir", config_.export_dir}, {"jobs", jobs}});
}

json ExportJobs::document(const Job& job) const {
  const plan::PlanGeometry& g = job.layout.geometry;
  json doc;
  doc["id"] = job.id;
  doc["state"] = job_state_name(job.state);
  doc["stage"] = job.loading ? "loading" : exporter::export_stage_name(job.progress.stage.load());
  doc["session"] = job.source.session;
  doc["file"] = job.source.file;
  doc["name"] = job.layout.name;
  doc["plan"] = {{"scan_crop", {g.region.row_start, g.region.row_stop, g.region.col_start, g.region.col_stop}},
                 {"scan_bin", g.scan_bin},
                 {"det_bin", g.detector_bin}};
  doc["shape"] = {g.scan_rows, g.scan_cols, g.detector_rows, g.detector_cols};
  doc["dtype"] = dtype_name(job.layout.dtype);
  doc["frames_done"] = job.progress.frames_done.load();
  doc["frames_total"] = g.positions();
  doc["bytes_written"] = job.progress.bytes_written.load();
  doc["export_dir"] = config_.export_dir;
  doc["folder"] = job.layout.name;
  doc["master"] = job.layout.name + "/" + job.layout.name + "_master.h5";
  doc["elapsed_seconds"] = job.state == JobState::queued || job.state == JobState::running
                               ? std::chrono::duration<double>(Clock::now() - job.created).count()
                               : job.elapsed_seconds;
  if (job.report) {
    const exporter::ExportReport& report = *job.report;
    doc["result"] = {{"path", report.folder},
                     {"master_path", report.master_path},
                     {"data_files", report.data_files},
                     {"stored_bytes", report.stored_bytes},
                     {"output_bytes", report.output_bytes},
                     {"source_bytes", report.source_bytes},
                     {"encoder", report.encoder},
                     {"seconds", exporter::stage_seconds_document<json>(report.seconds)}};
  }
  if (job.error_status != 0) doc["error"] = {{"status", job.error_status}, {"detail", job.error_detail}};
  return doc;
}

void ExportJobs::run_jobs() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      queued_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) {
        for (auto& waiting : queue_) {
          waiting->state = JobState::cancelled;
          waiting->progress.stage = exporter::ExportStage::cancelled;
        }
        queue_.clear();
        return;
      }
      job = queue_.front();
      queue_.pop_front();
      job->state = JobState::running;
    }
    run(*job);
  }
}

void ExportJobs::run(Job& job) {
  std::optional<exporter::ExportReport> report;
  int status = 0;
  std::string detail;
  try {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job.loading = true;
    }
    // The same admission as any load; the lease keeps the resident while the export runs.
    const residency::ResidentLease lease = residency_.acquire(job.acquisition);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job.loading = false;
    }
    residency::WorkingMemoryGrant working_memory;
    if (config_.working_memory_on_device) {
      working_memory = residency_.admit_working_memory(lease->device_index(), job.layout.working_bytes,
                                                       "the export of " + job.layout.name);
    }
    report = exporter::export_plan(*lease, job.acquisition, job.layout, job.request, job.progress,
                                   [&lease] { return lease.lock_compute(); });
    spdlog::info("export {}: {} written in {:.3f} s ({} bytes)", job.id, report->folder, report->seconds.total,
                 report->output_bytes);
  } catch (const Error& e) {
    status = http_status(e.kind());
    detail = e.what();
  } catch (const std::exception& e) {
    status = 500;
    detail = e.what();
  }
  if (status != 0) spdlog::warn("export {}: {} failed: {}", job.id, job.layout.name, detail);
  std::lock_guard<std::mutex> lock(mutex_);
  job.loading = false;
  job.elapsed_seconds = std::chrono::duration<double>(Clock::now() - job.created).count();
  job.report = std::move(report);
  job.error_status = status;
  job.error_detail = detail;
  if (job.report) {
    job.state = JobState::done;
  } else if (job.progress.cancel_requested.load()) {
    job.state = JobState::cancelled;
    job.progress.stage = exporter::ExportStage::cancelled;
  } else {
    job.state = JobState::failed;
    job.progress.stage = exporter::ExportStage::failed;
  }
}

void ExportJobs::forget_old_jobs_locked() {
  const auto finished_job = [](const Job& job) { return job.state != JobState::queued && job.state != JobState::running; };
  const auto now = Clock::now();
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    const Job& job = *it->second;
    const bool expired = finished_job(job) && now - job.created > config_.kept_finished_job_age;
    it = expired ? jobs_.erase(it) : std::next(it);
  }
  std::size_t finished = 0;
  for (const auto& [id, job] : jobs_) finished += finished_job(*job);
  for (auto it = jobs_.begin(); it != jobs_.end() && finished > config_.kept_finished_jobs;) {
    const bool done = finished_job(*it->second);
    if (done) {
      it = jobs_.erase(it);
      --finished;
    } else {
      ++it;
    }
  }
}

}  // namespace quantem::server
