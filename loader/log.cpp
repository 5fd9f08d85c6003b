#include "loader/log.h"

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
  } else if (level >= KH_LOG_WARN) {
    std::fprintf(stderr, "kernel-hub: %s\n", line.c_str());
  }
}

}  // namespace kh
