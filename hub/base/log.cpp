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
               terminal_safe(line).c_str());
}

}  // namespace

std::string terminal_safe(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

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
