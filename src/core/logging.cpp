#include "quantem/core/logging.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <mutex>

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

namespace quantem::logging {

namespace {

// Writes all of `text` to fd 2. A stream that is gone (EPIPE: the reader
// closed the pipe; EBADF: stderr closed; EIO: the terminal hung up) or full
// and non-blocking drops the line: logging never stops the daemon.
void write_stderr(const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(STDERR_FILENO, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

// "<N>": the syslog priority prefix journald reads from a service's stderr
// (sd-daemon(3): <3> error ... <7> debug).
const char* journal_prefix(spdlog::level::level_enum level) {
  static const char* const prefixes[] = {"<7>", "<7>", "<6>", "<4>", "<3>", "<2>", "<6>"};
  const auto index = static_cast<std::size_t>(level);
  return prefixes[index < 7 ? index : 6];
}

class JournalPriorityFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& message, const std::tm&, spdlog::memory_buf_t& destination) override {
    const char* prefix = journal_prefix(message.level);
    destination.append(prefix, prefix + 3);
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<JournalPriorityFlag>(); }
};

// spdlog's own stderr sinks write through stdio; this one writes each line
// with one write(2) (lines of concurrent threads never interleave) and, on a
// terminal, colours the level like spdlog's colour sink.
class StderrSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit StderrSink(bool colour) : colour_(colour) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& message) override {
    spdlog::memory_buf_t formatted;
    formatter_->format(message, formatted);
    if (colour_ && message.color_range_end > message.color_range_start) {
      std::string line(formatted.data(), formatted.size());
      line.insert(message.color_range_end, "\033[m");
      line.insert(message.color_range_start, colour_of(message.level));
      write_stderr(line.data(), line.size());
    } else {
      write_stderr(formatted.data(), formatted.size());
    }
  }
  void flush_() override {}

 private:
  static const char* colour_of(spdlog::level::level_enum level) {
    switch (level) {
      case spdlog::level::trace: return "\033[37m";
      case spdlog::level::debug: return "\033[36m";
      case spdlog::level::info: return "\033[32m";
      case spdlog::level::warn: return "\033[33m\033[1m";
      case spdlog::level::err: return "\033[31m\033[1m";
      case spdlog::level::critical: return "\033[1m\033[41m";
      default: return "\033[m";
    }
  }
  bool colour_;
};

bool journal_stream() {
  const char* stream = std::getenv("JOURNAL_STREAM");
  return stream != nullptr && *stream != '\0';
}

spdlog::level::level_enum spdlog_level(Level level) {
  switch (level) {
    case Level::trace: return spdlog::level::trace;
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

}  // namespace

std::optional<Level> parse_level(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "trace") return Level::trace;
  if (lower == "debug") return Level::debug;
  if (lower == "info") return Level::info;
  if (lower == "warn" || lower == "warning") return Level::warn;
  if (lower == "error") return Level::error;
  return std::nullopt;
}

const char* level_names() { return "trace|debug|info|warn|error"; }

bool journal_mode() { return journal_stream(); }

void configure() {
  const bool journal = journal_stream();
  const bool terminal = !journal && ::isatty(STDERR_FILENO) == 1;
  auto sink = std::make_shared<StderrSink>(terminal);
  auto logger = std::make_shared<spdlog::logger>("quantem", sink);
  if (journal) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<JournalPriorityFlag>('*').set_pattern("%*%v");
    logger->set_formatter(std::move(formatter));
  } else if (terminal) {
    logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%^%l%$] %v");
  } else {
    logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%l] %v");
  }
  spdlog::set_default_logger(logger);
  Level level = Level::info;
  if (const char* name = std::getenv(kLevelVariable); name && *name) level = parse_level(name).value_or(Level::info);
  set_level(level);
}

void set_level(Level level) { spdlog::set_level(spdlog_level(level)); }

void ignore_broken_pipes() { ::signal(SIGPIPE, SIG_IGN); }

void fatal(const std::string& message) {
  std::string text;
  const bool journal = journal_stream();
  std::size_t start = 0;
  while (start <= message.size()) {
    std::size_t end = message.find('\n', start);
    if (end == std::string::npos) end = message.size();
    if (end > start || start == 0) {
      if (journal) text += journal_prefix(spdlog::level::err);
      text.append(message, start, end - start);
      text += '\n';
    }
    start = end + 1;
  }
  spdlog::default_logger()->flush();
  write_stderr(text.data(), text.size());
}

}  // namespace quantem::logging
