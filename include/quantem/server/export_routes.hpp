#pragma once
// The export job routes (docs/protocol.md "Export"): a plan of a catalogued
// acquisition saved as an Arina-style acquisition below the daemon's
// --export-dir, run as a job on one thread of its own, one export at a time.
//
//   POST   /api/browse/export?session=&file=[&det_bin=&scan_bin=&row_start=...][&frames_per_file=]
//            -> 202 {"id", "name", "state": "queued", ...}, location /api/browse/export/<id>
//   GET    /api/browse/export           -> {"export_dir", "jobs": [...]}
//   GET    /api/browse/export/<id>      -> the job: state, progress, where the result went, error
//   DELETE /api/browse/export/<id>      -> cancels it (nothing is left of a cancelled export)
//
// Output names are made from the source's stem and the plan
// (exporter::export_name); a client never names a path. Without an export
// folder every route answers 409 saying how to enable it. The source is
// loaded (when it is not resident) through ResidencyManager::acquire, the
// same admission as any load; the export then holds a lease (the resident is
// never evicted under it) and takes the resident's compute lock one batch of
// frames at a time, so product requests on it keep being answered.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "quantem/protocol/query.hpp"
#include "quantem/residency/residency_manager.hpp"
#include "quantem/server/catalog_service.hpp"
#include "quantem/server/http_types.hpp"

namespace quantem::server {

struct ExportJobsConfig {
  std::string export_dir;               // absolute; empty: exports are off
  std::string implementation_revision;  // recorded in every export
  unsigned threads = 0;                 // read+encode workers per export; 0: all cores
  std::size_t kept_finished_jobs = 64;  // finished jobs remembered for GET (oldest forgotten first)
  // Finished jobs older than this (since their POST) are forgotten too.
  std::chrono::seconds kept_finished_job_age{std::chrono::hours(24)};
  // Jobs waiting behind the running one; a POST past it answers 503 with retry-after.
  std::size_t max_queued_jobs = 64;
  // The backend's devices are host memory (the CPU backend): the export's
  // working memory is admitted on its resident's device too.
  bool working_memory_on_device = false;
};

extern const char* const kExportDisabledMessage;

class ExportJobs {
 public:
  ExportJobs(ExportJobsConfig config, residency::ResidencyManager& residency, CatalogService& catalog);
  ~ExportJobs();  // shutdown()
  ExportJobs(const ExportJobs&) = delete;
  ExportJobs& operator=(const ExportJobs&) = delete;

  static bool handles(const std::string& path);  // /api/browse/export and /api/browse/export/<id>
  // Answers one of the routes above; throws quantem::Error (the service maps it).
  HttpResponse handle(const HttpRequest& request, const protocol::QueryParams& params);

  // Cancels every job and joins the job thread; later POSTs answer 503.
  void shutdown();

 private:
  struct Job;
  HttpResponse start(const protocol::QueryParams& params);
  HttpResponse show(const std::string& id) const;
  HttpResponse cancel(const std::string& id);
  HttpResponse list() const;
  nlohmann::ordered_json document(const Job& job) const;
  void run_jobs();
  void run(Job& job);
  void forget_old_jobs_locked();

  ExportJobsConfig config_;
  residency::ResidencyManager& residency_;
  CatalogService& catalog_;

  mutable std::mutex mutex_;
  std::condition_variable queued_;
  std::map<std::uint64_t, std::shared_ptr<Job>> jobs_;  // by id, oldest first
  std::deque<std::shared_ptr<Job>> queue_;
  std::uint64_t next_id_ = 1;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace quantem::server
