#include "tools/demo/data.h"

#include <algorithm>
#include <numeric>

namespace kh::demo {

BigramData::BigramData(int vocab, double follow, uint64_t table_seed, uint64_t stream_seed)
    : vocab_(vocab), follow_(follow), successor_(static_cast<size_t>(vocab)), rng_(stream_seed) {
  std::iota(successor_.begin(), successor_.end(), 0);
  // Our own Fisher-Yates over mt19937_64 (std::shuffle's use of the engine is unspecified), so
  // the pattern is the same with every standard library.
  std::mt19937_64 table(table_seed);
  for (size_t i = successor_.size(); i > 1; --i)
    std::swap(successor_[i - 1], successor_[table() % i]);
}

BigramData::Batch BigramData::next(int batch, int seq) {
  Batch b;
  b.inputs.resize(static_cast<size_t>(batch) * seq);
  b.targets.resize(b.inputs.size());
  auto uniform = [&] { return static_cast<int64_t>(rng_() % static_cast<uint64_t>(vocab_)); };
  auto coin = [&] { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; };
  for (int r = 0; r < batch; ++r) {
    int64_t tok = uniform();
    for (int t = 0; t <= seq; ++t) {
      const size_t i = static_cast<size_t>(r) * seq + t;
      if (t < seq) b.inputs[i] = tok;
      if (t > 0) b.targets[i - 1] = tok;
      tok = coin() < follow_ ? successor(tok) : uniform();
    }
  }
  return b;
}

}  // namespace kh::demo
