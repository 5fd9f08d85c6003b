// Synthetic training data with a learnable pattern: a fixed random "successor" permutation of
// the vocabulary; each next token is successor[previous] with probability `follow`, else uniform
// noise. A model that learns the pattern falls from ln(vocab) (5.55 for 256) towards the
// generator's entropy (about 1.6 nats at follow = 0.8), and its greedy continuation follows the
// permutation's cycle. Everything is seeded: the same seeds give the same batches.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kh::demo {

class BigramData {
 public:
  // The permutation comes from table_seed; the stream of batches from stream_seed.
  BigramData(int vocab, double follow, uint64_t table_seed, uint64_t stream_seed);

  // batch rows of seq + 1 tokens: inputs are tokens [0, seq), targets [1, seq].
  struct Batch {
    std::vector<int64_t> inputs;   // [batch * seq]
    std::vector<int64_t> targets;  // [batch * seq]
  };
  Batch next(int batch, int seq);

  int64_t successor(int64_t token) const { return successor_[static_cast<size_t>(token)]; }
  int vocab() const { return vocab_; }

 private:
  int vocab_;
  double follow_;
  std::vector<int64_t> successor_;
  std::mt19937_64 rng_;
};

}  // namespace kh::demo
