// The native worker's C++ unit tests (CMake target edgebench-worker-tests, run by ctest from
// tests/test_native_cpp.py): the optimizers against steps worked out by hand from torch.optim's
// formulas, the plan reader on good and bad plans (every value out of its range, not a number,
// past 64 bits; a file name leaving its folder), the checked whole numbers the worker's
// arguments are read with, the thread pool's loops, the saved weights (safetensors), the
// evaluation points and the divergence rule.

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "common.h"
#include "evaluation.h"
#include "optimizers.h"
#include "parallel.h"
#include "plan.h"

#include <unistd.h>

using namespace edgebench;

namespace {

int g_failures = 0;

// A failed check prints where and goes on, so one run shows every failure.
#define CHECK(cond)                                                      \
  do {                                                                   \
    if (!(cond)) {                                                       \
      std::fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      ++g_failures;                                                      \
    }                                                                    \
  } while (0)

bool near(double got, double want, double rel = 1e-6) {
  bool ok = std::fabs(got - want) <= rel * std::max(1.0, std::fabs(want));
  if (!ok) std::fprintf(stderr, "  got %.9g, want %.9g\n", got, want);
  return ok;
}

// One step of `opt` over one tensor `w` with gradient `g` at learning rate `lr`.
void step(Optimizer& opt, std::vector<float>& w, const std::vector<float>& g, float lr, float scale = 1.0f) {
  opt.step({{w.data(), w.size(), lr}}, Gradients{{g.data()}, scale});
}

void sgd() {
  SGD plain(SGDOptions{});
  std::vector<float> w{1.0f, 2.0f};
  step(plain, w, {0.5f, -1.0f}, 0.1f);  // w - lr * g
  CHECK(near(w[0], 0.95) && near(w[1], 2.1));
  step(plain, w, {0.5f, -1.0f}, 0.1f, 0.5f);  // the gradient read at half (the clip's coefficient)
  CHECK(near(w[0], 0.925) && near(w[1], 2.15));
}

void sgd_momentum() {
  SGD opt(SGDOptions{0.9f});
  std::vector<float> w{1.0f, 2.0f};
  step(opt, w, {0.5f, -1.0f}, 0.1f);  // buffer = g = [0.5, -1]
  CHECK(near(w[0], 0.95) && near(w[1], 2.1));
  step(opt, w, {0.25f, 0.5f}, 0.1f);  // buffer = 0.9 * [0.5, -1] + [0.25, 0.5] = [0.7, -0.4]
  CHECK(near(w[0], 0.88) && near(w[1], 2.14));
}

// lr 0.1, betas (0.9, 0.999), eps 1e-8, g = 0.5 then -0.25 from w = 1:
//   step 1: m = 0.05, v = 0.00025; m^ = 0.5, v^ = 0.25: w = 1 - 0.1 * 0.5 / (0.5 + 1e-8) = 0.900000002
//   step 2: m = 0.02, v = 0.00031225; m^ = 0.02 / 0.19, v^ = 0.00031225 / 0.001999:
//           w = 0.900000002 - 0.1 * 0.105263158 / 0.395225377 = 0.873366299
// AdamW (decay 0.01) first multiplies w by 1 - lr * 0.01 = 0.999 each step: 0.899000002, 0.871467299.
void adam(float weight_decay, double first, double second) {
  Adam opt(AdamOptions{0.9f, 0.999f, 1e-8f, weight_decay});
  std::vector<float> w{1.0f}, other{3.0f, 3.0f};  // a second tensor: state kept per tensor
  std::vector<float> g1{0.5f}, g2{-0.25f}, zero{0.0f, 0.0f};
  opt.step({{w.data(), 1, 0.1f}, {other.data(), 2, 0.1f}}, Gradients{{g1.data(), zero.data()}});
  CHECK(near(w[0], first));
  opt.step({{w.data(), 1, 0.1f}, {other.data(), 2, 0.1f}}, Gradients{{g2.data(), zero.data()}});
  CHECK(near(w[0], second));
  double decayed = 3.0 * std::pow(1.0 - 0.1 * weight_decay, 2);  // a zero gradient moves it by decay only
  CHECK(near(other[0], decayed) && near(other[1], decayed));
}

// L2 weight decay (torch's SGD and Adam: g += wd * w after the clip's scale), wd 0.5, lr 0.1,
// worked out in float64 by torch.optim: w = [1, 2], g = [0.5, -1] makes g + wd * w = [1, 0].
void weight_decay_l2() {
  SGD plain(SGDOptions{0.0f, 0.5f});
  std::vector<float> w{1.0f, 2.0f};
  step(plain, w, {0.5f, -1.0f}, 0.1f);
  CHECK(near(w[0], 0.9) && near(w[1], 2.0));
  step(plain, w, {0.5f, -1.0f}, 0.1f, 0.5f);  // the scale reads the gradient only: [0.25, -0.5] + [0.45, 1]
  CHECK(near(w[0], 0.83) && near(w[1], 1.95));
  SGD momentum(SGDOptions{0.9f, 0.5f});  // the decayed gradient enters the buffer: [1, 0], then [1.6, 1.5]
  std::vector<float> m{1.0f, 2.0f};
  step(momentum, m, {0.5f, -1.0f}, 0.1f);
  step(momentum, m, {0.25f, 0.5f}, 0.1f);
  CHECK(near(m[0], 0.74) && near(m[1], 1.85));
  Adam adam(AdamOptions{0.9f, 0.999f, 1e-8f, 0.5f, false});  // and Adam's moments: no step where it cancels
  std::vector<float> a{1.0f, 2.0f};
  step(adam, a, {0.5f, -1.0f}, 0.1f);
  CHECK(near(a[0], 0.900000001) && near(a[1], 2.0));
  step(adam, a, {-0.25f, 0.5f}, 0.1f);
  CHECK(near(a[0], 0.819695904) && near(a[1], 1.925586318));
  OptimizerConstants constants{0.0f, 0.9f, 0.999f, 1e-8f, 0.5f, false};  // by name: adam's L2 from the plan
  auto by_name = make_optimizer("adam", constants);
  std::vector<float> b{1.0f, 2.0f};
  step(*by_name, b, {0.5f, -1.0f}, 0.1f);
  CHECK(near(b[0], 0.900000001) && near(b[1], 2.0));
}

void optimizers_by_name() {
  OptimizerConstants constants{0.9f, 0.9f, 0.999f, 1e-8f, 0.01f};
  for (const char* name : {"sgd", "sgd-momentum", "adam", "adamw"}) CHECK(make_optimizer(name, constants) != nullptr);
  CHECK(make_optimizer("adafactor", constants) == nullptr);
  CHECK(make_optimizer("", constants) == nullptr);
}

const std::string kGood = std::string(kPlanFormat) + "\n" +
    "kind joint\n"
    "group_lr 0.001 0.00512\n"
    "\n"
    "clip 1.0\n"
    "total_steps 12\n"
    "input input_ids int64 1 16\n"
    "input pixel_values float32 1 3 32 32\n"
    "predicted {\"total_bytes\": 1024, \"parts\": {}}\n";

Plan parse(const std::string& text) {
  std::istringstream in(text);
  return Plan::parse(in, "plan.txt", "/plans/x");
}

// The message of the PlanError `f` throws; "" if it throws none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const PlanError& e) {
    return e.what();
  }
  return "";
}

bool says(const std::string& message, const std::string& part) {
  bool ok = message.find(part) != std::string::npos;
  if (!ok) std::fprintf(stderr, "  \"%s\" does not say \"%s\"\n", message.c_str(), part.c_str());
  return ok;
}

void good_plan() {
  Plan plan = parse(kGood);
  CHECK(plan.dir() == "/plans/x");
  CHECK(plan.text("kind") == "joint");
  CHECK(plan.real("group_lr", 1) == 0.00512);
  CHECK(plan.real("clip") == 1.0);
  CHECK(plan.integer("total_steps") == 12);
  auto inputs = plan.all("input");
  CHECK(inputs.size() == 2 && inputs[1]->text(0) == "pixel_values" && inputs[1]->integer(5) == 32);
  CHECK(inputs[1]->number() == 8 && inputs[1]->size() == 6);
  CHECK(plan.line("predicted").rest() == "{\"total_bytes\": 1024, \"parts\": {}}");
  CHECK(plan.find("momentum") == nullptr);
}

// kGood with line `number` (1-based) replaced by `line`.
std::string with_line(int number, const std::string& line) {
  std::istringstream in(kGood);
  std::string out, text;
  for (int i = 1; std::getline(in, text); ++i) out += (i == number ? line : text) + "\n";
  return out;
}

void bad_plans() {
  const std::string fix = "write the plan again";
  std::string e = error_of([] { parse(with_line(5, "clip abc")).real("clip"); });
  CHECK(says(e, "plan.txt:5: clip: \"abc\" is not a number") && says(e, fix));
  e = error_of([] { parse(with_line(5, "clip 1.5x")).real("clip"); });
  CHECK(says(e, "plan.txt:5: clip: \"1.5x\" is not a number"));
  e = error_of([] { parse(with_line(5, "clip")).real("clip"); });
  CHECK(says(e, "plan.txt:5: clip: has 0 values, needs 1"));
  e = error_of([] { parse(with_line(3, "group_lr 0.001")).real("group_lr", 1); });
  CHECK(says(e, "plan.txt:3: group_lr: has 1 values, needs 2"));
  e = error_of([] { parse(with_line(6, "total_steps 1.5")).integer("total_steps"); });
  CHECK(says(e, "plan.txt:6: total_steps: \"1.5\" is not a whole number"));
  e = error_of([] { parse(with_line(6, "total_steps 99999999999999999999")).integer("total_steps"); });
  CHECK(says(e, "plan.txt:6: total_steps: \"99999999999999999999\" is not a whole number"));
  e = error_of([] { parse(with_line(7, "input input_ids int64 1 0")); });
  CHECK(says(e, "plan.txt:7: input: \"0\" is not a whole number in 1..2147483647"));
  e = error_of([] { parse(with_line(7, "input")); });
  CHECK(says(e, "plan.txt:7: input: has 0 values, needs 3 or more"));
  e = error_of([] { parse(kGood).real("steps"); });
  CHECK(says(e, "plan.txt: no `steps` line") && says(e, fix));
  e = error_of([] { parse(with_line(1, "edgebench-native-plan 1")); });  // an older format
  CHECK(says(e, "plan.txt: not a native plan of this worker's format"));
  e = error_of([] { parse(""); });
  CHECK(says(e, "plan.txt: empty"));
  e = error_of([] { Plan::read("/nonexistent/plan.txt"); });
  CHECK(says(e, "/nonexistent/plan.txt: cannot read the native plan"));
}

// kGood with `line` added as its line 10, and what reading it says ("" for nothing).
std::string read_with(const std::string& line) {
  return error_of([&] { parse(kGood + line + "\n"); });
}

// Every value out of its range is refused naming the line, the key, the value and the range,
// as the table build.py generates from plan.py says (so a range added there is tested here).
void values_out_of_range() {
  auto refused_as = [](const LineRule& rule, size_t at, const std::string& bad, const std::string& what) {
    std::string line = rule.key;
    for (size_t i = 0; i < rule.values.size(); ++i) {
      const ValueRule& r = rule.values[i];
      std::string good = r.kind == ValueRule::kWhole ? std::to_string(r.least)
                         : r.kind == ValueRule::kReal ? std::to_string(r.above ? r.low + 1 : r.low)
                                                      : "x";
      line += " " + (i == at ? bad : good);
    }
    CHECK(says(read_with(line), "plan.txt:10: " + rule.key + ": \"" + bad + "\" " + what));
  };
  for (const LineRule& rule : kPlanValues) {
    CHECK(says(read_with(rule.key), "plan.txt:10: " + rule.key + ": has 0 values, needs "));
    for (size_t at = 0; at < rule.values.size(); ++at) {
      const ValueRule& r = rule.values[at];
      if (r.kind == ValueRule::kWhole) {
        std::string range = "is not a whole number in " + std::to_string(r.least) + "..";
        for (const char* bad : {"abc", "1.5", "12x"}) refused_as(rule, at, bad, range);
        if (r.least > LLONG_MIN) refused_as(rule, at, std::to_string(r.least - 1), range);
        refused_as(rule, at, r.most < LLONG_MAX ? std::to_string(r.most + 1) : "9223372036854775808", range);
        refused_as(rule, at, "99999999999999999999", range);  // past 64 bits, not wrapped
      } else if (r.kind == ValueRule::kReal) {
        std::string range = std::string("is not a number in ") + (r.above ? "(" : "[");
        for (const char* bad : {"abc", "1.5x", "nan", "inf", "-inf", "1e999"}) refused_as(rule, at, bad, range);
        refused_as(rule, at, std::to_string(r.low - 1), range);
        if (r.above) refused_as(rule, at, std::to_string(r.low), range);
        if (std::isfinite(r.high)) refused_as(rule, at, std::to_string(r.high * 2 + 1), range);
      }
    }
  }
  // the ranges the host uses (edgebench/runner/spec.py, methods/knobs.py, cli_types.py)
  CHECK(says(read_with("threads 1025"), "plan.txt:10: threads: \"1025\" is not a whole number in 0..1024"));
  CHECK(says(read_with("threads -1"), "threads: \"-1\" is not a whole number in 0..1024"));
  CHECK(says(read_with("accumulation 0"), "accumulation: \"0\" is not a whole number in 1..1024"));
  CHECK(says(read_with("accumulation 2000000000"), "accumulation: \"2000000000\" is not a whole number in 1..1024"));
  CHECK(says(read_with("steps 1000001"), "steps: \"1000001\" is not a whole number in 1..1000000"));
  CHECK(says(read_with("steps 1e20"), "steps: \"1e20\" is not a whole number in 1..1000000"));
  CHECK(says(read_with("seed 18446744073709551616"), "seed: \"18446744073709551616\" is not a whole number in 0.."));
  CHECK(says(read_with("group_lr 0.001 0"), "group_lr: \"0\" is not a number in (0, inf)"));
  CHECK(says(read_with("group_lr nan 0.001"), "group_lr: \"nan\" is not a number in (0, inf)"));
  CHECK(says(read_with("duration_s 1e9"), "duration_s: \"1e9\" is not a number in [0, 604800]"));
  CHECK(says(read_with("threads 4 4"), "threads: has 2 values, needs 1") && says(read_with("threads 4 4"), "write the plan again"));
  CHECK(read_with("threads 0").empty() && read_with("threads 1024").empty() && read_with("seed 9223372036854775807").empty());
  CHECK(read_with("group_lr 1e-300 5.12e-3").empty() && read_with("betas 0.9 0.999").empty());
  CHECK(read_with("predicted anything {at all").empty());  // JSON, echoed: not checked here
}

// A file name the plan gives is one plain path component of the folder it is joined to.
void names_stay_in_their_folder() {
  const std::string outside = "would name a file outside its folder";
  for (const char* bad : {"../x", "a/b", "/etc/passwd", ".", "..", ".hidden"}) {
    CHECK(says(read_with(std::string("batches ") + bad), "plan.txt:10: batches: \"" + std::string(bad) + "\" " + outside));
    CHECK(says(read_with(std::string("eval_weights ") + bad + " 6 .safetensors"),
               "plan.txt:10: eval_weights: \"" + std::string(bad) + " 6 .safetensors\" " + outside));
  }
  CHECK(says(read_with("eval_weights eval- 6 /../../x"), outside));
  CHECK(says(read_with("eval_weights eval- 21 .safetensors"), "eval_weights: \"21\" is not a whole number in 1..20"));
  CHECK(read_with("batches batches.bin").empty() && read_with("eval_weights eval-weights- 6 .safetensors").empty());
}

bool refused(const std::string& text) {
  bool ok = !whole_number(text).has_value();
  if (!ok) std::fprintf(stderr, "  \"%s\" was read as %lld\n", text.c_str(), *whole_number(text));
  return ok;
}

// How the worker reads --repeats, --pass-elements and --normal-elements ("abc" was once 0).
void whole_numbers() {
  CHECK(whole_number("7") == 7LL);
  CHECK(whole_number("-3") == -3LL);
  CHECK(whole_number("9223372036854775807") == 9223372036854775807LL);
  for (const char* bad : {"abc", "12x", "1.5", "", "1e3", "99999999999999999999"}) CHECK(refused(bad));
}

void parallel_loops() {
  size_t n = 3 * kGrain + 5;  // several chunks and a partial one
  std::vector<int> hits(n, 0);
  parallel_each(n, [&](size_t k) { hits[k] += 1; });
  bool once = true;
  for (int h : hits) once = once && h == 1;
  CHECK(once);
  CHECK(parallel_sum(n, [](size_t k) { return double(k); }) == double(n) * double(n - 1) / 2.0);
  CHECK(parallel_sum(0, [](size_t) { return 1.0; }) == 0.0);
  CHECK(parallel_sum(7, [](size_t) { return 1.0; }) == 7.0);
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// The file the host reads back (edgebench.results.heldout): the header as Python's json.dumps
// writes it compactly, padded to 8 bytes; the data right after it, at the header's offsets.
void safetensors(const std::string& dir) {
  std::vector<float> a{0.5f, -1.0f, 2.0f, 3.0f, 4.0f, 5.0f}, b{7.0f, -8.25f};
  std::vector<uint16_t> c{0x3f80, 0xc000, 0x4040};  // bf16 1, -2, 3: an updating program's own weights
  std::vector<Param> params{{"a.weight", 0, a.data(), 6, {2, 3}}, {"b\"q", 1, b.data(), 2, {}},
                            {"c", 0, reinterpret_cast<float*>(c.data()), 3, {3}, "BF16", 2}};
  std::string path = dir + "/w.safetensors";
  write_safetensors(path, params);
  std::string bytes = read_all(path);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | uint8_t(bytes[size_t(i)]);
  std::string header = "{\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                       "\"b\\\"q\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,32]},"
                       "\"c\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[32,38]}}";
  CHECK(length % 8 == 0 && length >= header.size() && length < header.size() + 8);
  CHECK(bytes.size() == 8 + length + 38);
  CHECK(bytes.substr(8, header.size()) == header);
  CHECK(bytes.substr(8 + header.size(), length - header.size()) == std::string(length - header.size(), ' '));
  CHECK(std::memcmp(bytes.data() + 8 + length, a.data(), 24) == 0);
  CHECK(std::memcmp(bytes.data() + 8 + length + 24, b.data(), 8) == 0);
  CHECK(std::memcmp(bytes.data() + 8 + length + 32, c.data(), 6) == 0);
  CHECK(!exists(path + ".partial"));
  std::string missing = dir + "/no-such-folder/w.safetensors";
  bool threw = false;
  try {
    write_safetensors(missing, params);
  } catch (const std::runtime_error& e) {
    threw = says(e.what(), "cannot write " + missing);
  }
  CHECK(threw && !exists(missing) && !exists(missing + ".partial"));
}

// The plan's schedule and file name; nothing saved at step 0; a failed write is an
// `eval_failed` event and ends the evaluations.
void evaluation_points(const std::string& dir) {
  Plan plan = parse(kGood + "eval_every 2\neval_weights eval-weights- 6 .safetensors\n");
  std::vector<float> w{1.0f};
  std::vector<Param> params{{"w", 0, w.data(), 1, {1}}};
  {
    Events events(dir + "/events.jsonl");
    Evaluation saved(plan, dir);
    CHECK(saved.wanted() && saved.due(0) && !saved.due(3) && saved.due(4));
    CHECK(saved.file(12) == "eval-weights-000012.safetensors");
    saved.run(0, params, events);
    saved.run(2, params, events);
    CHECK(!exists(dir + "/eval-weights-000000.safetensors") && exists(dir + "/eval-weights-000002.safetensors"));
    CHECK(saved.last() == 2);
    Evaluation failing(plan, dir + "/no-such-folder");
    failing.run(2, params, events);
    CHECK(!failing.wanted() && !failing.due(4));
  }
  std::istringstream lines(read_all(dir + "/events.jsonl"));
  std::vector<std::string> got;
  for (std::string line; std::getline(lines, line);) got.push_back(line);
  CHECK(got.size() == 3);
  if (got.size() == 3) {
    CHECK(says(got[0], "\"event\": \"eval_weights\", \"end_ns\": ") && says(got[0], "\"after_steps\": 0}"));
    CHECK(says(got[1], "\"after_steps\": 2}"));
    CHECK(says(got[2], "\"event\": \"eval_failed\", \"after_steps\": 2, \"detail\": \"cannot write "));
  }
  CHECK(parse(kGood + "eval_every 0\neval_weights a 6 b\n").line("eval_every").integer(0) == 0);
  CHECK(!Evaluation(parse(kGood + "eval_every 0\neval_weights a 6 b\n"), dir).wanted());
}

// The step at which LossWatch ends the run, -1 for none.
int first_diverged(const std::vector<double>& losses) {
  LossWatch watch;
  for (size_t step = 0; step < losses.size(); ++step)
    if (watch.diverged(losses[step])) return int(step);
  return -1;
}

// tests/test_divergence.py's CASES, the Python rule's: the two must agree.
void loss_watch() {
  const double nan = std::nan(""), inf = INFINITY;
  CHECK(first_diverged({6, 5, 4, 3, 2, 1}) == -1);
  CHECK(first_diverged({1, 1, 1, 1, 1, 20, 1, 1}) == -1);
  CHECK(first_diverged({1, 1, 1, 1, 1, 20, 20}) == 6);
  CHECK(first_diverged({1, 2, 3, 4, 5, 6, 7, 8}) == 7);
  CHECK(first_diverged({1, 8}) == -1);
  CHECK(first_diverged({1, 10}) == 1);
  CHECK(first_diverged({1, 2, nan}) == 2);
  CHECK(first_diverged({inf}) == 0);
  CHECK(first_diverged({1, -inf}) == 1);
}

void detail_cap() {
  CHECK(json_detail("short \"one\"") == "\"short \\\"one\\\"\"");
  std::string ascii(MAX_DETAIL_CHARS + 10, 'x');
  CHECK(json_detail(ascii).size() == MAX_DETAIL_CHARS + 2);  // the cap and its quotes
  std::string wide = std::string(MAX_DETAIL_CHARS - 1, 'x') + "\xc3\xa9" + "tail";  // an é across the cap
  std::string got = json_detail(wide);
  CHECK(got.size() == MAX_DETAIL_CHARS + 1 && got[got.size() - 2] == 'x');  // cut before the é, not inside it
}

}  // namespace

int main() {
  sgd();
  sgd_momentum();
  adam(0.0f, 0.900000002, 0.873366299);
  adam(0.01f, 0.899000002, 0.871467299);
  weight_decay_l2();
  optimizers_by_name();
  good_plan();
  bad_plans();
  values_out_of_range();
  names_stay_in_their_folder();
  whole_numbers();
  parallel_loops();
  loss_watch();
  detail_cap();
  char dir[] = "/tmp/edgebench-worker-tests-XXXXXX";
  if (!mkdtemp(dir)) {
    std::perror("mkdtemp");
    return 1;
  }
  safetensors(dir);
  evaluation_points(dir);
  std::filesystem::remove_all(dir);
  if (g_failures) std::fprintf(stderr, "%d check(s) failed\n", g_failures);
  else std::puts("edgebench-worker-tests: all checks passed");
  return g_failures ? 1 : 0;
}
