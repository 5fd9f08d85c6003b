#include "hub/base/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

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
// The terminal's width, 80 when it does not say.
size_t terminal_columns() {
  winsize w{};
  if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) return w.ws_col;
  return 80;
}
}  // namespace

std::string fit_label(const std::string& label, size_t tail, size_t columns) {
  // One column spare: a line that fills the terminal wraps on some, and each \r redraw then
  // leaves a line behind.
  const size_t room = columns > tail + 1 ? columns - tail - 1 : 0;
  if (label.size() <= room) return label;
  if (room < 8) return label.substr(0, room);
  // The middle goes ("kernel-hub/activation@sha256:a2b4...3529"): both ends say which it is.
  const size_t head = (room - 3) / 2, back = room - 3 - head;
  return label.substr(0, head) + "..." + label.substr(label.size() - back);
}

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
  char tail[160];
  std::snprintf(tail, sizeof tail, " [%s] %3d%% %s / %s %s/s%s", bar.c_str(),
                static_cast<int>(frac * 100), human_bytes(static_cast<double>(done_)).c_str(),
                human_bytes(static_cast<double>(total_)).c_str(), human_bytes(rate).c_str(),
                final ? "" : "   ");
  const std::string line = fit_label(label_, std::strlen(tail), terminal_columns()) + tail;
  std::fprintf(stderr, "\r%s", line.c_str());
  std::fflush(stderr);
}

}  // namespace kh
