#include "hub/base/progress.h"

#include <unistd.h>

#include <cstdio>

namespace kh {

namespace {
std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", b, units[u]);
  return buf;
}
}  // namespace

Progress::Progress(std::string label, bool enabled)
    : label_(std::move(label)), active_(enabled && ::isatty(STDERR_FILENO)) {
  start_ = last_draw_ = std::chrono::steady_clock::now();
}

Progress::~Progress() {
  finish();
}

void Progress::add_total(uint64_t bytes) {
  total_ += bytes;
}

void Progress::advance(int64_t bytes) {
  done_ += bytes;
  if (!active_) return;
  auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ > std::chrono::milliseconds(100)) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::finish() {
  if (!active_ || finished_) return;
  finished_ = true;
  draw(true);
  std::fputc('\n', stderr);
}

void Progress::draw(bool final) {
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  double rate = secs > 0 ? static_cast<double>(done_) / secs : 0;
  constexpr int kWidth = 30;
  double frac = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  if (frac > 1) frac = 1;
  if (frac < 0) frac = 0;
  int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::fprintf(stderr, "\r%s [%s] %3d%% %s / %s %s/s%s", label_.c_str(), bar.c_str(),
               static_cast<int>(frac * 100), human_bytes(static_cast<double>(done_)).c_str(),
               human_bytes(static_cast<double>(total_)).c_str(), human_bytes(rate).c_str(),
               final ? "" : "   ");
  std::fflush(stderr);
}

}  // namespace kh
