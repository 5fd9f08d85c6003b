// The greedy decode step's argmax pieces that two kernels share (device_decode.cu's
// kh_argmax_advance over written logits, skinny_gemm.cu's LM head with the argmax as its
// epilogue): the first index of a row's maximum (as the host's std::max_element), merged across
// threads and CTAs, and the row's advance to the next step. Included after the prelude (KH_DEV).
#ifndef KH_DEMO_GREEDY_ARGMAX_CUH_
#define KH_DEMO_GREEDY_ARGMAX_CUH_

namespace {

// Column c with value x into a walk's best (v, idx); idx == vocab: nothing seen yet. Indices
// grow along a thread's walk: the first maximum stays.
KH_DEV void argmax_take(float x, long long c, long long vocab, float& v, long long& idx) {
  if (x > v || idx == vocab) {
    v = x;
    idx = c;
  }
}

// Whether candidate (ov, oi) beats (v, idx) (index vocab: no element seen).
KH_DEV bool argmax_better(float ov, long long oi, float v, long long idx, long long vocab) {
  return oi != vocab && (idx == vocab || ov > v || (ov == v && oi < idx));
}

// (v, idx) as one unsigned key whose order is the argmax's: the float's bits made monotonic as
// an unsigned integer above, the complement of the index below (the lower index wins a tie).
// Never 0, the empty key, for an index below 2^32 - 1. CTAs meet by atomicMax on it.
KH_DEV unsigned long long argmax_key(float v, long long idx) {
  const unsigned int u = __float_as_uint(v);
  const unsigned int ordered = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ((unsigned long long)ordered << 32) | (0xFFFFFFFFu - (unsigned int)idx);
}

// The index a non-empty key holds.
KH_DEV long long argmax_key_index(unsigned long long key) {
  return 0xFFFFFFFFu - (unsigned int)(key & 0xFFFFFFFFu);
}

// Sequence b's greedy token `idx`: the next step's input, out_tokens[b][step] (when step <
// out_cols), and the sequence one position on. The caller advances *step once every row has.
KH_DEV void greedy_advance(int b, long long idx, int step, long long* tokens, long long* positions,
                           int* seq_lens, long long* out_tokens, int out_cols) {
  tokens[b] = idx;
  positions[b] += 1;
  seq_lens[b] += 1;
  if (step < out_cols) out_tokens[(long long)b * out_cols + step] = idx;
}

}  // namespace

#endif  // KH_DEMO_GREEDY_ARGMAX_CUH_
