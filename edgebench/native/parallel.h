// The update's element loops, split over the runtime's thread pool: it is idle between program
// calls, and its threads are started once, not per tensor per step.
#pragma once

#include <executorch/runtime/kernel/thread_parallel_interface.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace edgebench {

// Below this many elements a loop stays on the calling thread (waking the pool costs more).
inline constexpr size_t kGrain = size_t(1) << 16;

// f(k) for every k in [0, n).
template <typename F>
void parallel_each(size_t n, const F& f) {
  executorch::extension::parallel_for(0, int64_t(n), int64_t(kGrain), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) f(size_t(k));
  });
}

// The sum of f(k) over [0, n), in chunks of kGrain added in order: the same total whatever the
// pool's size.
template <typename F>
double parallel_sum(size_t n, const F& f) {
  size_t chunks = (n + kGrain - 1) / kGrain;
  std::vector<double> sums(chunks, 0.0);
  auto sum_chunks = [&](int64_t first, int64_t last) {
    for (int64_t c = first; c < last; ++c) {
      size_t begin = size_t(c) * kGrain, end = std::min(n, begin + kGrain);
      for (size_t k = begin; k < end; ++k) sums[size_t(c)] += f(k);
    }
  };
  if (chunks > 1) executorch::extension::parallel_for(0, int64_t(chunks), 1, sum_chunks);
  else sum_chunks(0, int64_t(chunks));
  double total = 0.0;
  for (double s : sums) total += s;
  return total;
}

}  // namespace edgebench
