// edgebench's native training worker: runs an exported ExecuTorch training program with no
// Python and no PyTorch in the process, and writes the events the Python worker writes
// (edgebench/runner/worker.py), so the supervisor, result.json, collect, live and report are
// the same for both.
//
//   edgebench-worker PLAN --program EXPORT_DIR --out RUN_DIR
//   edgebench-worker --clock    (monotonic and wall clock: the shell sweep's timestamps)
//   edgebench-worker --rates RATES_DIR --repeats N --pass-elements N --normal-elements N
//                               (the step-time model's rates as this worker spends time: `edgebench
//                               devices calibrate` on a device without Python; see rates.h)
//
// PLAN is plan.txt (written on the host by edgebench/native/plan.py: one `key values...` per
// line) with batches.bin beside it (each step's inputs, raw, in the program's input order).
// EXPORT_DIR holds model.pte (and trainable_init.bin for a forward-only program).
//
// This file is the process: its arguments, its set-up and how a run's end is reported. The
// run is program.h's; each program kind is a class of its own:
//   joint         program_joint.h: forward + backward, the update runs here
//   updating      program_updating.h: the update is written into the program
//   forward-only  program_forward_only.h: MeZO
//
// Exit codes are the Python worker's, from exit_codes.h, which build.py generates from
// edgebench/figures/status.py.

#include "common.h"
#include "plan.h"
#include "program.h"
#include "rates.h"

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <new>
#include <optional>
#include <string>

using namespace edgebench;

namespace {

// A number read whole ("abc" is not 0): a bad one ends the worker as a usage error naming
// where it came from and the value.
long long whole_or_exit(const std::string& name, const std::string& value) {
  std::optional<long long> v = whole_number(value);
  if (!v) {
    std::fprintf(stderr, "native worker: %s: \"%s\" is not a whole number\n", name.c_str(), value.c_str());
    std::exit(EXIT_ERROR);
  }
  return *v;
}

long long vm_hwm_bytes() {  // /proc/self/status VmHWM: this process's resident high-water mark
  std::ifstream status("/proc/self/status");
  std::string key;
  long long kb = 0;
  while (status >> key) {
    if (key == "VmHWM:" && status >> kb) return kb * 1024;
    status.ignore(1 << 12, '\n');
  }
  return -1;
}

void die_with_parent() {
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);  // a dying supervisor takes its worker with it
  const char* expected = std::getenv("EDGEBENCH_SUPERVISOR_PID");
  if (expected && getppid() != whole_or_exit("EDGEBENCH_SUPERVISOR_PID", expected)) std::exit(EXIT_INTERRUPTED);
}

void volunteer_for_oom_kill() {  // the OOM killer takes the worker, never the supervisor
  if (std::FILE* fh = std::fopen("/proc/self/oom_score_adj", "w")) {
    std::fputs("1000", fh);
    std::fclose(fh);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string plan_path, program_dir, out, rates_dir;
  long long repeats = 0, pass_elements = 0, normal_elements = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--program" && i + 1 < argc) program_dir = argv[++i];
    else if (arg == "--rates" && i + 1 < argc) rates_dir = argv[++i];
    else if (arg == "--repeats" && i + 1 < argc) repeats = whole_or_exit(arg, argv[++i]);
    else if (arg == "--pass-elements" && i + 1 < argc) pass_elements = whole_or_exit(arg, argv[++i]);
    else if (arg == "--normal-elements" && i + 1 < argc) normal_elements = whole_or_exit(arg, argv[++i]);
    else if (arg == "--out" && i + 1 < argc) out = argv[++i];
    else if (arg == "--version") { std::puts("edgebench-worker 1"); return 0; }
    else if (arg == "--clock") {  // for a shell with no clock of its own: monotonic and wall, seconds and ns apart
      timespec mono{}, wall{};
      clock_gettime(CLOCK_MONOTONIC, &mono);
      clock_gettime(CLOCK_REALTIME, &wall);
      std::printf("%lld %ld %lld %ld\n", (long long)mono.tv_sec, mono.tv_nsec, (long long)wall.tv_sec, wall.tv_nsec);
      return 0;
    }
    else plan_path = arg;
  }
  if (!rates_dir.empty()) {  // one JSON line on stdout; a failure is one line on stderr and exit 1
    try {
      return rates(rates_dir, repeats, pass_elements, normal_elements);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "native worker --rates: %s\n", e.what());
      return EXIT_ERROR;
    }
  }
  if (plan_path.empty() || program_dir.empty() || out.empty()) {
    std::fprintf(stderr, "usage: %s PLAN --program EXPORT_DIR --out RUN_DIR\n"
                         "       %s --rates RATES_DIR --repeats N --pass-elements N --normal-elements N\n", argv[0], argv[0]);
    return EXIT_ERROR;
  }
  die_with_parent();
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
  volunteer_for_oom_kill();
  // The plan is read whole and checked before anything is written: a refused one is this one
  // line on stderr, and the run directory stays as it was.
  Plan plan;
  try {
    plan = Plan::read(plan_path);
  } catch (const PlanError& e) {
    std::fprintf(stderr, "native worker: %s\n", e.what());
    return EXIT_ERROR;
  }
  std::unique_ptr<Events> events;
  try {
    events = std::make_unique<Events>(out + "/events.jsonl");
  } catch (const Failure& f) {
    std::fprintf(stderr, "%s\n", f.what());
    return f.code;
  }
  int code = EXIT_ERROR;
  try {
    code = train(plan, program_dir, out, *events);
  } catch (const Failure& f) {
    if (f.code == EXIT_NO_SPACE || f.event.empty()) {
      std::fprintf(stderr, "%s\n", f.what());
      return f.code;
    }
    code = f.code;
    try { events->write(f.event, std::string("\"detail\": ") + json_detail(f.what())); } catch (const Failure& g) { return g.code; }
  } catch (const std::bad_alloc&) {
    code = EXIT_OOM;
    try { events->write("oom", "\"detail\": \"std::bad_alloc: the native worker could not allocate memory\""); } catch (...) {}
  } catch (const std::exception& e) {
    try { events->write("error", std::string("\"detail\": ") + json_detail(std::string("native worker: ") + e.what())); } catch (...) {}
  }
  // The worker's own peak: the supervisor's ru_maxrss of it would start at the supervisor's RSS
  // (Linux carries the parent's high-water mark across exec).
  long long hwm = vm_hwm_bytes();
  if (hwm > 0) {
    try { events->write("memory", "\"vm_hwm_bytes\": " + std::to_string(hwm)); } catch (...) {}
  }
  return code;
}
