// What every part of the native worker shares: the failure that ends a run, the clock, the
// events file, ExecuTorch's errors, the stop signals, MeZO's generator and the divergence rule.
#pragma once

#include "exit_codes.h"

#include <executorch/runtime/core/error.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>

namespace edgebench {

struct Failure : std::runtime_error {  // ends the run with this exit code and event
  int code;
  std::string event;
  Failure(int c, std::string ev, const std::string& what) : std::runtime_error(what), code(c), event(std::move(ev)) {}
};

[[noreturn]] void fail(const std::string& what);  // an `error` event and EXIT_ERROR

int64_t now_ns();  // Python's time.monotonic_ns: one clock for both workers

std::string json_string(const std::string& s);
// An error's detail as a JSON string: at most MAX_DETAIL_CHARS bytes of `s` (cut at a UTF-8
// character's start), so at most that many characters, the cap the host's typed event holds
// (edgebench/figures/run_events.py MAX_TEXT_CHARS; tests/test_restated_constants.py holds the two equal).
constexpr size_t MAX_DETAIL_CHARS = 1048576;
std::string json_detail(const std::string& s);
std::string json_number(double v);  // NaN and +-Infinity as Python's json writes them

// events.jsonl: one flushed line per event, as edgebench.telemetry.trace.TraceWriter writes.
class Events {
 public:
  explicit Events(const std::string& path);
  ~Events();
  // `t_ns`: when it began, for an event that spans time (an evaluation point's).
  void write(const std::string& event, const std::string& fields = "", int64_t t_ns = now_ns());

 private:
  std::FILE* fh_;
};

std::string error_text(executorch::runtime::Error e);
// An ExecuTorch call that failed: `oom` for an allocation, else an error naming `where`.
[[noreturn]] void runtime_failure(executorch::runtime::Error e, const std::string& where);

// The divergence rule, edgebench/figures/status.py's LossWatch (a test holds these constants to
// its): a loss that is not finite, or a mean of the last DIVERGED_WINDOW losses past
// DIVERGED_FACTOR times the first. Fed each step's loss in turn, warmup steps too.
constexpr double DIVERGED_FACTOR = 5.0;
constexpr size_t DIVERGED_WINDOW = 5;

class LossWatch {
 public:
  bool diverged(double loss);

 private:
  std::optional<double> first_;
  std::deque<double> recent_;
};

void on_signal(int signum);  // SIGTERM's and SIGINT's handler: the run stops at its next check
void check_signal();         // throws the `interrupted` Failure once one has come

// Inline, as Normal: MeZO's perturbations and --rates' normal_ns draw it per element.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// z for parameter `index` under `seed`: standard normal (Box-Muller over splitmix64), the
// same sequence every time it is regenerated, never stored.
struct Normal {
  uint64_t state;
  bool has_spare = false;
  float spare = 0.0f;
  float next() {
    if (has_spare) {
      has_spare = false;
      return spare;
    }
    double u1 = (double(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double u2 = double(splitmix64(state) >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1));
    spare = float(r * std::sin(2.0 * M_PI * u2));
    has_spare = true;
    return float(r * std::cos(2.0 * M_PI * u2));
  }
};

}  // namespace edgebench
