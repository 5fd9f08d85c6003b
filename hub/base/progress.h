// A byte-count progress bar on stderr. Draws only when enabled and stderr is a TTY;
// otherwise silent. Not thread-safe: drive it from one thread (the download loop).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kh {

// `label` shortened (its middle left out) so that it and `tail` more columns fit a terminal
// `columns` wide: the bar is redrawn with \r, which a wrapped line defeats.
std::string fit_label(const std::string& label, size_t tail, size_t columns);

class Progress {
 public:
  Progress(std::string label, bool enabled);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add_total(uint64_t bytes);
  void advance(int64_t bytes);  // negative on restarts
  void finish();                // prints the final line (TTY only)
  bool active() const { return active_; }

 private:
  void draw(bool final);
  std::string label_;
  bool active_;
  uint64_t total_ = 0;
  int64_t done_ = 0;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool finished_ = false;
};

}  // namespace kh
