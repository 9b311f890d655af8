// The only translation unit of the daemon that includes Boost.Asio and
// Boost.Beast (decision 0008). I/O threads run every socket operation
// asynchronously; a fixed worker pool calls the handler, and a second pool
// runs the answers that have to wait for a load (decision 0017).
#include "quantem/server/http_server.hpp"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cctype>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <spdlog/spdlog.h>

#include "quantem/core/error.hpp"
#include "quantem/core/text.hpp"
#include "unix_socket_file.hpp"

namespace quantem::server {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using boost::system::error_code;
using Tcp = asio::ip::tcp;
using Local = asio::local::stream_protocol;

constexpr std::chrono::milliseconds kLingerAfterRefusal{2000};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX decoded; '+' stays '+' (a path, not a form); a malformed escape stays literal.
std::string percent_decode_path(std::string_view raw) {
  std::string out;
  out.reserve(raw.size());
  for (std::size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '%' && i + 2 < raw.size()) {
      const int high = hex_value(raw[i + 1]), low = hex_value(raw[i + 2]);
      if (high >= 0 && low >= 0) {
        out.push_back(static_cast<char>(high * 16 + low));
        i += 2;
        continue;
      }
    }
    out.push_back(raw[i]);
  }
  return out;
}

void name_this_thread(const std::string& name) { pthread_setname_np(pthread_self(), name.substr(0, 15).c_str()); }

// Busy-waits until `ready()` or `window` has passed; true if ready.
template <class Ready>
bool spin_until(Ready ready, std::chrono::microseconds window) {
  if (window.count() <= 0) return ready();
  const auto deadline = std::chrono::steady_clock::now() + window;
  while (true) {
    for (int i = 0; i < 64; ++i) {
      if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    }
    if (std::chrono::steady_clock::now() >= deadline) return ready();
  }
}

// Runs handler calls on a fixed set of threads, first come first served. A
// worker that finished a job busy-waits for the next one for `spin` before
// it sleeps on the condition variable, so a keep-alive client's next request
// finds an awake thread; submit() wakes a sleeping worker only when none is
// busy-waiting.
class WorkerPool {
 public:
  enum class Submitted { queued, full, stopped };

  // Beyond one job per thread, `max_queued` more may wait for a thread (0:
  // no limit); the count includes jobs not yet picked up by an idle thread.
  WorkerPool(int threads, std::chrono::microseconds spin, const std::string& name, std::size_t max_queued = 0)
      : spin_(spin),
        max_outstanding_(max_queued == 0 ? 0 : static_cast<std::size_t>(std::max(1, threads)) + max_queued) {
    for (int index = 0; index < std::max(1, threads); ++index) {
      threads_.emplace_back([this, index, name] {
        name_this_thread(name + std::to_string(index));
        work();
      });
    }
  }
  ~WorkerPool() {
    stop();
    join();
  }

  // The job is not run when the pool is stopped or its queue is full.
  Submitted submit(std::function<void()> job) {
    int queued = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopped_) return Submitted::stopped;
      if (max_outstanding_ > 0) {
        if (outstanding_ >= max_outstanding_) return Submitted::full;
        ++outstanding_;
      }
      jobs_.push_back(std::move(job));
      queued = queued_.fetch_add(1) + 1;
    }
    // Wake a sleeping worker unless a busy-waiting one is there for every
    // queued job. A busy-waiting worker stops counting itself before it
    // checks the queue under the lock and sleeps, so a skipped wake-up never
    // strands a job.
    if (queued > spinning_.load()) wake_.notify_one();
    return Submitted::queued;
  }

  // Jobs not started are dropped; running ones finish.
  void stop() {
    std::deque<std::function<void()>> dropped;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopped_ = true;
      stopping_.store(true);
      dropped.swap(jobs_);
      if (max_outstanding_ > 0) outstanding_ -= dropped.size();
      queued_.store(0);
    }
    wake_.notify_all();
  }

  void join() {
    for (auto& thread : threads_)
      if (thread.joinable()) thread.join();
  }

 private:
  void work() {
    bool after_job = false;
    while (true) {
      if (after_job && spin_.count() > 0) {
        spinning_.fetch_add(1);
        spin_until([this] { return queued_.load(std::memory_order_relaxed) > 0 || stopping_.load(); }, spin_);
        spinning_.fetch_sub(1);
      }
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stopped_ || !jobs_.empty(); });
        if (stopped_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
        queued_.fetch_sub(1);
      }
      job();
      if (max_outstanding_ > 0) {
        std::lock_guard<std::mutex> lock(mutex_);
        --outstanding_;
      }
      after_job = true;
    }
  }

  const std::chrono::microseconds spin_;
  const std::size_t max_outstanding_;  // 0: no limit
  std::mutex mutex_;
  std::size_t outstanding_ = 0;  // jobs queued or running
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool stopped_ = false;
  std::atomic<int> queued_{0};    // jobs_.size(), readable without the lock
  std::atomic<int> spinning_{0};  // workers busy-waiting for a job
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
};

// Request bodies are read and dropped as they arrive: no route takes one
// (HttpRequest has no body), so a connection holds no more of a body than its
// read buffer, whatever the Content-Length (docs/decisions/0017).
struct DiscardedBody {
  struct value_type {};
  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(http::header<isRequest, Fields>&, value_type&) {}
    void init(const boost::optional<std::uint64_t>&, error_code& ec) { ec = {}; }
    template <class ConstBufferSequence>
    std::size_t put(const ConstBufferSequence& buffers, error_code& ec) {
      ec = {};
      return asio::buffer_size(buffers);
    }
    void finish(error_code& ec) { ec = {}; }
  };
};

// A read buffer above this is given back when the connection waits for its
// next request (one request line and headers fit far below it).
constexpr std::size_t kIdleReadBufferBytes = 16 << 10;
// At the end of the shutdown grace, requests still in flight are answered
// 503; this long is given to write those answers.
constexpr std::chrono::milliseconds kStoppingAnswerWindow{500};

struct Target {
  std::string path;   // percent-decoded
  std::string query;  // raw
  std::optional<std::string> authority;  // absolute-form only ("host:port")
};

bool starts_with_ignoring_case(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && iequals(text.substr(0, prefix.size()), prefix);
}

Target split_target(std::string_view target) {
  Target split;
  // absolute-form ("http://host/path?query") names its host (RFC 9112 section 3.2.2).
  for (std::string_view scheme : {"http://", "https://"}) {
    if (!starts_with_ignoring_case(target, scheme)) continue;
    target.remove_prefix(scheme.size());
    const auto authority_end = std::min(target.find_first_of("/?"), target.size());
    split.authority = std::string(target.substr(0, authority_end));
    target.remove_prefix(authority_end);
    break;
  }
  const auto question = target.find('?');
  const std::string_view path = target.substr(0, question);
  split.path = split.authority && path.empty() ? std::string("/") : percent_decode_path(path);
  if (question != std::string_view::npos) split.query = std::string(target.substr(question + 1));
  return split;
}

// The request as the service sees it. A request in absolute-form is for the
// host its target names, whatever its Host header says (RFC 9112 section
// 3.2.2): that authority is the Host the service checks.
template <class Message>
HttpRequest request_from(const Message& message) {
  HttpRequest request;
  request.method = std::string(message.method_string());
  Target target = split_target(message.target());
  request.path = std::move(target.path);
  request.query = std::move(target.query);
  request.headers.reserve(static_cast<std::size_t>(std::distance(message.begin(), message.end())) + 1);
  for (const auto& field : message) {
    std::string name = to_lower(field.name_string());
    if (target.authority && name == "host") continue;
    request.headers.emplace_back(std::move(name), std::string(field.value()));
  }
  if (target.authority) request.headers.emplace_back("host", std::move(*target.authority));
  return request;
}

HttpResponse retry_later(const std::string& detail) {
  HttpResponse response = HttpResponse::detail(503, detail);
  response.set_header("retry-after", "1");
  return response;
}

class Connection;

// Everything the connections share.
struct Core {
  Core(HttpService service_in, HttpServerOptions options_in)
      : service(std::move(service_in)),
        options(options_in),
        ioc(std::max(1, options_in.io_threads)),
        work(asio::make_work_guard(ioc)),
        waiting_pool(options_in.waiting_threads, std::chrono::microseconds(0), "quantem-wait-",
                     options_in.max_waiting_requests),
        pool(options_in.threads, options_in.spin_wait, "quantem-http-") {}

  HttpService service;
  HttpServerOptions options;

  // Declared before the io_context: connections destroyed with its pending
  // handlers still unregister and count here.
  // Live connections (weak: a connection lives as long as its operations).
  std::mutex registry_mutex;
  std::unordered_map<const Connection*, std::weak_ptr<Connection>> registry;

  // Requests read and not yet answered (or closed).
  std::mutex requests_mutex;
  std::condition_variable requests_changed;
  int active_requests = 0;
  bool drained = false;  // the stop() pass over connections has run on the I/O threads

  // run()/stop() hand-over.
  std::mutex state_mutex;
  std::condition_variable state_changed;
  bool bound = false;
  bool running = false;
  bool stop_started = false;
  bool stop_finished = false;

  asio::io_context ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  std::optional<Tcp::acceptor> tcp_acceptor;
  std::optional<Local::acceptor> unix_acceptor;
  std::string unix_path;
  unix_socket::FileIdentity unix_file;
  std::atomic<bool> stopping{false};
  // Requests that wait (HttpResponse::later), apart from the workers so that
  // waiting never holds the threads that answer everything else.
  WorkerPool waiting_pool;
  WorkerPool pool;  // declared last: joined (and its queued jobs dropped) first

  void request_started() {
    std::lock_guard<std::mutex> lock(requests_mutex);
    ++active_requests;
  }
  void request_finished() {
    {
      std::lock_guard<std::mutex> lock(requests_mutex);
      --active_requests;
    }
    requests_changed.notify_all();
  }

  // The handler's answer, or (when it returned HttpResponse::later) the
  // answer of `later` run here. Never throws.
  template <class Call>
  static HttpResponse guarded(Call call) {
    try {
      return call();
    } catch (...) {
      // The handler is noexcept by contract; this only guards the server.
      HttpResponse response;
      response.status = 500;
      response.content_type = "text/plain; charset=utf-8";
      response.body = "Internal Server Error";
      return response;
    }
  }

  static void log_answer(const std::string& method, const std::string& path, const HttpResponse& response) {
    // The path only: a query may carry a token.
    spdlog::debug("{} {} -> {} ({} bytes)", method, path, response.status, response.sent_body().size());
  }

  template <class Acceptor>
  void accept_on(Acceptor& acceptor);
  std::vector<std::shared_ptr<Connection>> live_connections();
  void stop_accepting_and_drain();
  // True when every request read has been answered (or closed) by `deadline`.
  bool wait_for_requests(std::chrono::steady_clock::time_point deadline);
  void drain_connections();
  void answer_stopping_connections();
  void close_every_connection();
};

// One client connection: read a request (deadline), hand it to the pool,
// write the response, repeat while keep-alive. Every member function runs on
// the connection's strand (the socket's executor), except close_now() which
// stop() calls once no I/O thread runs.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  using Stream = asio::basic_stream_socket<asio::generic::stream_protocol>;

  Connection(Core& core, Stream socket)
      : core_(core),
        socket_(std::move(socket)),
        timer_(socket_.get_executor()),
        buffer_(core.options.max_header_bytes + core.options.max_body_bytes + 65536) {}

  ~Connection() {
    if (counted_) core_.request_finished();
    std::lock_guard<std::mutex> lock(core_.registry_mutex);
    core_.registry.erase(this);
  }

  void start() {
    {
      std::lock_guard<std::mutex> lock(core_.registry_mutex);
      core_.registry[this] = weak_from_this();
    }
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  // stop() (from any thread): a connection waiting for (or part-way through)
  // a request closes now; one whose request is being handled or written
  // finishes it and closes.
  void drain() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      if (self->state_ == State::reading || self->state_ == State::lingering) self->close();
    });
  }

  // stop(), at the end of the grace (from any thread): a request still being
  // handled or waiting for a load is answered 503 now rather than cut off.
  void answer_stopping() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] {
      self->answer(retry_later("the daemon is shutting down; retry"));
    });
  }

  void close_now() {
    error_code ignored;
    socket_.close(ignored);
  }

 private:
  enum class State { reading, handling, writing, lingering, closed };

  void read_request() {
    if (state_ == State::closed) return;
    if (core_.stopping) return close();
    state_ = State::reading;
    if (buffer_.size() == 0 && buffer_.capacity() > kIdleReadBufferBytes) buffer_.shrink_to_fit();
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(std::min<std::size_t>(core_.options.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(static_cast<std::uint64_t>(core_.options.max_body_bytes));
    arm_timer(core_.options.header_timeout);
    http::async_read_header(socket_, buffer_, *parser_,
                            [self = shared_from_this()](error_code ec, std::size_t) { self->on_header(ec); });
  }

  void on_header(error_code ec) {
    if (state_ != State::reading) return;
    if (ec) return on_read_error(ec);
    const auto& message = parser_->get();
    const auto fields = static_cast<std::size_t>(std::distance(message.begin(), message.end()));
    if (fields > core_.options.max_header_fields) {
      return refuse(431, "too many request header fields (" + std::to_string(fields) + "; at most " +
                             std::to_string(core_.options.max_header_fields) + ")");
    }
    const auto hosts = message.count(http::field::host);
    if (hosts > 1) return refuse(400, "a request carries one Host header (RFC 9112 section 3.2); this one has " + std::to_string(hosts));
    if (hosts == 0 && message.version() >= 11) return refuse(400, "an HTTP/1.1 request needs a Host header (RFC 9112 section 3.2)");
    if (message.count(http::field::transfer_encoding) > 0) {
      return refuse(411, "chunked request bodies are not accepted; send Content-Length");
    }
    if (message.count(http::field::content_encoding) > 0) return refuse(415, "compressed request bodies are not accepted");
    if (const auto length = parser_->content_length(); length && *length > core_.options.max_body_bytes) {
      return refuse(413, "request body too large (at most " + std::to_string(core_.options.max_body_bytes) + " bytes)");
    }
    if (parser_->is_done()) return dispatch();
    // A body follows: the Host and token checks first, so that the body of a
    // refused request is never read.
    if (auto refusal = screen(message)) return refuse_with(std::move(*refusal));
    const auto expect = message.find(http::field::expect);
    if (expect != message.end() && beast::iequals(expect->value(), "100-continue")) {
      static const char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(socket_, asio::buffer(kContinue, sizeof kContinue - 1),
                        [self = shared_from_this()](error_code write_ec, std::size_t) {
                          if (write_ec) return self->close();
                          self->read_body();
                        });
      return;
    }
    read_body();
  }

  void read_body() {
    http::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](error_code ec, std::size_t) {
      if (self->state_ != State::reading) return;
      if (ec) return self->on_read_error(ec);
      self->dispatch();
    });
  }

  void on_read_error(error_code ec) {
    if (ec == http::error::header_limit) {
      return refuse(431, "request line and headers too large (at most " + std::to_string(core_.options.max_header_bytes) +
                             " bytes and " + std::to_string(core_.options.max_header_fields) + " fields)");
    }
    if (ec == http::error::body_limit) {
      return refuse(413, "request body too large (at most " + std::to_string(core_.options.max_body_bytes) + " bytes)");
    }
    // The client went away, the deadline closed the socket, or stop() did.
    if (ec == http::error::end_of_stream || ec == http::error::partial_message || ec == asio::error::eof ||
        ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor || ec == asio::error::connection_reset ||
        ec.category() == asio::error::get_system_category()) {
      return close();
    }
    refuse(400, "malformed HTTP request: " + ec.message());
  }

  template <class Message>
  std::optional<HttpResponse> screen(const Message& message) {
    if (!core_.service.screen) return std::nullopt;
    try {
      return core_.service.screen(request_from(message));
    } catch (const std::exception& error) {
      spdlog::error("the request screen failed: {}", error.what());
      return HttpResponse::detail(500, "Internal Server Error");
    }
  }

  void dispatch() {
    cancel_timer();
    state_ = State::handling;
    const auto& message = parser_->get();
    HttpRequest request = request_from(message);
    version_ = message.version();
    keep_alive_ = message.keep_alive();
    head_ = message.method() == http::verb::head;
    parser_.reset();
    core_.request_started();
    counted_ = true;
    const auto submitted = core_.pool.submit(
        [self = shared_from_this(), request = std::move(request)] { self->run_handler(request); });
    if (submitted != WorkerPool::Submitted::queued) close();
  }

  // On a worker.
  void run_handler(const HttpRequest& request) {
    HttpResponse response = Core::guarded([&] { return core_.service.handle(request); });
    if (response.later) return wait_elsewhere(std::move(response.later), request);
    Core::log_answer(request.method, request.path, response);
    post_answer(std::move(response));
  }

  // On a worker: the request has to wait (for a load); its waiting and its
  // answer happen on the waiting threads, and this worker is free at once.
  void wait_elsewhere(std::function<HttpResponse()> later, const HttpRequest& request) {
    const auto submitted = core_.waiting_pool.submit(
        [self = shared_from_this(), later = std::move(later), method = request.method, path = request.path] {
          HttpResponse response = Core::guarded(later);
          Core::log_answer(method, path, response);
          self->post_answer(std::move(response));
        });
    if (submitted == WorkerPool::Submitted::full) {
      post_answer(retry_later("too many requests are waiting for loads (at most " +
                              std::to_string(core_.options.waiting_threads) + " waiting and " +
                              std::to_string(core_.options.max_waiting_requests) + " queued); retry"));
    }
    // Stopped: stop() answers every request still in flight, or closes it.
  }

  // From any thread: the answer is written on the connection's strand.
  void post_answer(HttpResponse response) {
    asio::post(socket_.get_executor(), [self = shared_from_this(), response = std::move(response)]() mutable {
      self->answer(std::move(response));
    });
  }

  // An answer that comes after stop() has answered the request (503) is dropped.
  void answer(HttpResponse response) {
    if (state_ != State::handling) return;
    write_response(std::move(response), false);
  }

  // A refusal before the handler: the client may still be sending (a huge
  // header block), so the answer is followed by a lingering close.
  void refuse(int status, const std::string& detail) {
    spdlog::debug("HTTP request refused: {} {}", status, detail);
    refuse_with(HttpResponse::detail(status, detail));
  }

  void refuse_with(HttpResponse response) {
    if (parser_) {
      version_ = parser_->is_header_done() ? parser_->get().version() : 11;
      head_ = parser_->is_header_done() && parser_->get().method() == http::verb::head;
    }
    parser_.reset();
    write_response(std::move(response), true);
  }

  void write_response(HttpResponse from, bool refusal) {
    if (state_ == State::closed) return;
    bool close_after = refusal || !keep_alive_ || core_.stopping;
    // The body is written from where it lies: moved out of the service's
    // response, or shared with the image cache; never copied.
    protocol::SharedBytes body = from.shared_body
                                     ? std::move(from.shared_body)
                                     : protocol::SharedBytes::of(std::make_shared<const std::string>(std::move(from.body)));
    auto response = std::make_shared<http::response<http::span_body<const char>>>();
    try {  // a status above 999 or an allocation failure must not reach the I/O thread
      response->version(version_);
      response->result(static_cast<unsigned>(from.status));
      for (auto& [name, value] : from.headers) {
        if (name == "connection") {
          close_after = close_after || beast::iequals(value, "close");
          continue;
        }
        if (name == "content-length") continue;
        response->insert(name, value);
      }
      // Field names go out in lower case, as the service wrote them.
      if (!from.content_type.empty()) response->set("content-type", from.content_type);
      const std::size_t length = body.size;
      const bool bodiless_status = (from.status >= 100 && from.status < 200) || from.status == 204 || from.status == 304;
      if (!bodiless_status) {
        response->set("content-length", std::to_string(length));
        if (!head_) response->body() = http::span_body<const char>::value_type(body.data, length);
      }
      if (close_after) {
        response->set("connection", "close");
      } else if (version_ < 11) {
        response->set("connection", "keep-alive");
      }
    } catch (const std::exception& error) {
      spdlog::error("an HTTP response could not be built: {}", error.what());
      return close();
    }
    state_ = State::writing;
    arm_timer(core_.options.write_timeout);
    http::async_write(socket_, *response,
                      [self = shared_from_this(), response, body, close_after, refusal](error_code ec, std::size_t) {
                        self->on_written(ec, close_after, refusal);
                      });
  }

  void on_written(error_code ec, bool close_after, bool linger) {
    if (state_ == State::closed) return;
    cancel_timer();
    if (counted_) {
      counted_ = false;
      core_.request_finished();
    }
    // end_of_stream: the message said `connection: close` (expected here).
    if (ec && ec != http::error::end_of_stream) return close();
    if (linger) return lingering_close();
    if (close_after) {
      error_code ignored;
      socket_.shutdown(asio::socket_base::shutdown_send, ignored);
      return close();
    }
    read_request();
  }

  // Half-close, then read and discard what the client still sends (bounded
  // in time, fixed memory) so that closing does not reset the connection
  // before the client has read the answer.
  void lingering_close() {
    state_ = State::lingering;
    error_code ignored;
    socket_.shutdown(asio::socket_base::shutdown_send, ignored);
    buffer_.clear();
    buffer_.shrink_to_fit();
    discard_ = std::make_unique<std::array<char, 16384>>();
    arm_timer(kLingerAfterRefusal);
    discard_more();
  }

  void discard_more() {
    socket_.async_read_some(asio::buffer(*discard_), [self = shared_from_this()](error_code ec, std::size_t) {
      if (self->state_ != State::lingering) return;
      if (ec) return self->close();
      self->discard_more();
    });
  }

  void close() {
    if (state_ == State::closed) return;
    state_ = State::closed;
    cancel_timer();
    error_code ignored;
    socket_.close(ignored);
    if (counted_) {
      counted_ = false;
      core_.request_finished();
    }
  }

  void arm_timer(std::chrono::milliseconds after) {
    const auto generation = ++timer_generation_;
    timer_.expires_after(after);
    timer_.async_wait([weak = weak_from_this(), generation](error_code ec) {
      if (ec) return;
      if (auto self = weak.lock(); self && self->timer_generation_ == generation) self->close();
    });
  }

  void cancel_timer() {
    ++timer_generation_;
    timer_.cancel();
  }

  Core& core_;
  Stream socket_;
  asio::steady_timer timer_;
  std::uint64_t timer_generation_ = 0;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<DiscardedBody>> parser_;
  std::unique_ptr<std::array<char, 16384>> discard_;
  State state_ = State::reading;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool head_ = false;
  bool counted_ = false;  // a request of this connection is in active_requests
};

template <class Acceptor>
void Core::accept_on(Acceptor& acceptor) {
  acceptor.async_accept(asio::make_strand(ioc), [this, &acceptor](error_code ec, typename Acceptor::protocol_type::socket socket) {
    if (!acceptor.is_open() || stopping) return;
    if (ec) {
      // EMFILE and friends: retry shortly instead of spinning.
      spdlog::warn("accepting an HTTP connection failed: {}", ec.message());
      auto retry = std::make_shared<asio::steady_timer>(acceptor.get_executor(), std::chrono::milliseconds(100));
      retry->async_wait([this, &acceptor, retry](error_code) {
        if (acceptor.is_open() && !stopping) accept_on(acceptor);
      });
      return;
    }
    if constexpr (std::is_same_v<typename Acceptor::protocol_type, Tcp>) {
      error_code ignored;
      // Responses go out as headers then body: without TCP_NODELAY, Nagle holds
      // the body until the client's delayed ACK, on every keep-alive request.
      socket.set_option(Tcp::no_delay(true), ignored);
      // Room for most of an image body in one write (the kernel caps the size
      // at net.core.wmem_max, doubled; an explicit size turns autotuning off,
      // which loopback clients do not need). A body in one write lowers the
      // loopback floor of a 1 MB response (scripts/device/loopback_floor.py).
      if (options.socket_send_buffer_bytes > 0) {
        socket.set_option(asio::socket_base::send_buffer_size(options.socket_send_buffer_bytes), ignored);
      }
    }
    std::make_shared<Connection>(*this, Connection::Stream(std::move(socket)))->start();
    accept_on(acceptor);
  });
}

std::vector<std::shared_ptr<Connection>> Core::live_connections() {
  std::vector<std::shared_ptr<Connection>> connections;
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (auto& [key, weak] : registry)
    if (auto connection = weak.lock()) connections.push_back(std::move(connection));
  return connections;
}

void Core::drain_connections() {
  for (auto& connection : live_connections()) connection->drain();
}

void Core::answer_stopping_connections() {
  for (auto& connection : live_connections()) connection->answer_stopping();
}

// Stops accepting and closes idle connections on the I/O threads.
void Core::stop_accepting_and_drain() {
  auto close_acceptor = [](auto& acceptor) {
    if (acceptor) {
      asio::post(acceptor->get_executor(), [&acceptor] {
        error_code ignored;
        acceptor->close(ignored);
      });
    }
  };
  close_acceptor(tcp_acceptor);
  close_acceptor(unix_acceptor);
  asio::post(ioc, [this] {
    drain_connections();
    // Queued after every connection's drain: with one I/O thread it runs after them
    // (with more, the grace still bounds the wait).
    asio::post(ioc, [this] {
      {
        std::lock_guard<std::mutex> lock(requests_mutex);
        drained = true;
      }
      requests_changed.notify_all();
    });
  });
}

bool Core::wait_for_requests(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(requests_mutex);
  return requests_changed.wait_until(lock, deadline, [this] { return drained && active_requests == 0; });
}

void Core::close_every_connection() {
  for (auto& connection : live_connections()) connection->close_now();
}

}  // namespace

struct HttpServer::Impl {
  Impl(HttpService service, HttpServerOptions options) : core(std::move(service), options) {}
  Core core;
};

HttpServer::HttpServer(Handler handler, HttpServerOptions options)
    : HttpServer(HttpService{std::move(handler), nullptr}, options) {}

HttpServer::HttpServer(HttpService service, HttpServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(service), options)) {}

HttpServer::~HttpServer() {
  stop();
  impl_->core.pool.join();
  impl_->core.waiting_pool.join();
}

int HttpServer::bind(const std::string& host, int port) {
  auto& core = impl_->core;
  const std::string address = host + ":" + std::to_string(port);
  error_code ec;
  Tcp::resolver resolver(core.ioc);
  const auto endpoints = resolver.resolve(host, std::to_string(port),
                                          Tcp::resolver::passive | Tcp::resolver::numeric_service, ec);
  if (ec) throw unavailable("cannot listen on " + address + ": " + ec.message());
  for (const auto& entry : endpoints) {
    Tcp::acceptor acceptor(asio::make_strand(core.ioc));  // its own strand: stop() closes it there
    acceptor.open(entry.endpoint().protocol(), ec);
    if (ec) continue;
    // SO_REUSEADDR only (never SO_REUSEPORT): a second daemon fails to bind.
    acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    acceptor.bind(entry.endpoint(), ec);
    if (ec) break;
    acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) break;
    const int bound_port = acceptor.local_endpoint().port();
    core.tcp_acceptor.emplace(std::move(acceptor));
    std::lock_guard<std::mutex> lock(core.state_mutex);
    core.bound = true;
    return bound_port;
  }
  throw unavailable("cannot listen on " + address + ": " + (ec ? ec.message() : std::string("no address")));
}

void HttpServer::bind_unix(const std::string& path) {
  auto& core = impl_->core;
  unix_socket::check_length(path);
  unix_socket::prepare_directory(path);
  unix_socket::remove_stale(path);
  // Bound under a temporary name, made 0600, then linked into place: the
  // socket is never reachable with wider permissions.
  const std::string temporary = unix_socket::temporary_path_for(path);
  unix_socket::check_length(temporary);
  ::unlink(temporary.c_str());
  Local::acceptor acceptor(asio::make_strand(core.ioc));
  error_code ec;
  acceptor.open(Local(), ec);
  if (!ec) acceptor.bind(Local::endpoint(temporary), ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    ::unlink(temporary.c_str());
    throw unavailable("cannot listen on the unix socket " + path + ": " + ec.message());
  }
  core.unix_file = unix_socket::publish(temporary, path);
  core.unix_path = path;
  core.unix_acceptor.emplace(std::move(acceptor));
  std::lock_guard<std::mutex> lock(core.state_mutex);
  core.bound = true;
}

void HttpServer::run() {
  auto& core = impl_->core;
  {
    std::lock_guard<std::mutex> lock(core.state_mutex);
    if (!core.bound) throw internal_error("HttpServer::run() before bind()");
    if (core.stop_started) return;
    core.running = true;
  }
  name_this_thread("quantem-http-io");
  if (core.tcp_acceptor) core.accept_on(*core.tcp_acceptor);
  if (core.unix_acceptor) core.accept_on(*core.unix_acceptor);
  // After any work an I/O thread polls for spin_wait before it sleeps in
  // epoll, so the response a worker posts and a keep-alive client's next
  // request are handled at once rather than after a wake-up.
  auto run_io = [&core] {
    const auto spin = core.options.spin_wait;
    while (true) {
      try {
        if (spin.count() <= 0) {
          core.ioc.run();
          return;
        }
        while (!core.ioc.stopped()) {
          if (spin_until([&core] { return core.ioc.poll() > 0 || core.ioc.stopped(); }, spin)) continue;
          core.ioc.run_one();
        }
        return;
      } catch (const std::exception& error) {
        spdlog::error("HTTP I/O thread: {}", error.what());
      }
    }
  };
  std::vector<std::thread> more_io_threads;
  for (int index = 1; index < core.options.io_threads; ++index) {
    more_io_threads.emplace_back([&run_io] {
      name_this_thread("quantem-http-io");
      run_io();
    });
  }
  run_io();
  for (auto& thread : more_io_threads) thread.join();
  {
    std::lock_guard<std::mutex> lock(core.state_mutex);
    core.running = false;
  }
  core.state_changed.notify_all();
}

void HttpServer::stop() {
  auto& core = impl_->core;
  bool was_running = false;
  {
    std::unique_lock<std::mutex> lock(core.state_mutex);
    if (core.stop_started) {
      core.state_changed.wait(lock, [&core] { return core.stop_finished; });
      return;
    }
    core.stop_started = true;
    core.stopping = true;
    was_running = core.running;
  }
  if (was_running) {
    core.stop_accepting_and_drain();
    // Requests already read may finish until the grace ends; those still in
    // flight then (a long load above all) are answered 503, not cut off.
    if (!core.wait_for_requests(std::chrono::steady_clock::now() + core.options.shutdown_grace)) {
      asio::post(core.ioc, [&core] { core.answer_stopping_connections(); });
      core.wait_for_requests(std::chrono::steady_clock::now() + kStoppingAnswerWindow);
    }
  }
  core.work.reset();
  core.ioc.stop();
  {
    std::unique_lock<std::mutex> lock(core.state_mutex);
    core.state_changed.wait(lock, [&core] { return !core.running; });
  }
  // No I/O thread runs any more: close what is left from here.
  core.pool.stop();
  core.waiting_pool.stop();
  core.close_every_connection();
  error_code ignored;
  if (core.tcp_acceptor) core.tcp_acceptor->close(ignored);
  if (core.unix_acceptor) core.unix_acceptor->close(ignored);
  if (!core.unix_path.empty()) unix_socket::remove_if_ours(core.unix_path, core.unix_file);
  {
    std::lock_guard<std::mutex> lock(core.state_mutex);
    core.stop_finished = true;
  }
  core.state_changed.notify_all();
}

}  // namespace quantem::server
