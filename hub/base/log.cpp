#include "hub/base/log.h"

#include <cstdio>
#include <mutex>

namespace kh {

namespace {

std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}

LogSink& sink() {
  static LogSink s;
  return s;
}

// Without a sink: warnings and errors to stderr, labelled; debug and info lines are dropped.
void default_sink(int level, const std::string& line) {
  if (level < kLogWarn) return;
  std::fprintf(stderr, "kernel-hub: %s: %s\n", level >= kLogError ? "error" : "warning",
               line.c_str());
}

}  // namespace

LogSink set_log_sink(LogSink next) {
  std::lock_guard lock(sink_mutex());
  LogSink previous = std::move(sink());
  sink() = std::move(next);
  return previous;
}

void log_line(int level, const std::string& line) {
  std::lock_guard lock(sink_mutex());
  if (sink()) {
    sink()(level, line);
  } else {
    default_sink(level, line);
  }
}

void log_warning(const std::string& line) {
  log_line(kLogWarn, line);
}

}  // namespace kh
