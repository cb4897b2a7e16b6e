// --rates: the step-time model's rates (edgebench/methods/device_speed.py's fields), each taken
// the way this worker spends time in training, the fastest of `repeats` after one warm-up:
//   matmul_gflops     RATES_DIR/fp32.pte (edgebench/native/rates.py: per shape, a linear layer's
//                     forward and its two backward products, lowered as training programs are);
//   bf16_matmul_cost  RATES_DIR/bf16.pte's time over fp32.pte's (null, with why, if it cannot run);
//   pass_ns           the updates' loop shape: read two fp32 arrays, write one (parallel_each);
//   normal_ns         MeZO's generator (Normal), one thread, as perturb draws.
#pragma once

#include <string>

namespace edgebench {

// Prints the rates as one JSON line on stdout and returns EXIT_OK; throws a Failure if the
// fp32 program cannot run.
int rates(const std::string& dir, long long repeats, long long pass_elements, long long normal_elements);

}  // namespace edgebench
