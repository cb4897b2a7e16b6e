// edgebench's native training worker: runs an exported ExecuTorch training program with no
// Python and no PyTorch in the process, and writes the events the Python worker writes
// (edgebench/runner/worker.py), so the supervisor, result.json, collect, live and report are
// the same for both.
//
//   edgebench-worker PLAN --program EXPORT_DIR --out RUN_DIR
//   edgebench-worker --clock    (monotonic and wall clock: the shell sweep's timestamps)
//   edgebench-worker --rates RATES_DIR --repeats N --pass-elements N --normal-elements N
//                               (the step-time model's rates as this worker spends time: `edgebench
//                               devices calibrate` on a device without Python; see rates() below)
//
// PLAN is plan.txt (written on the host by edgebench/native/plan.py: one `key values...` per
// line) with batches.bin beside it (each step's inputs, raw, in the program's input order).
// EXPORT_DIR holds model.pte (and trainable_init.bin for a forward-only program).
//
// Program kinds:
//   joint         forward + backward; outputs [loss, ..., gradients, parameters]; the update
//                 (SGD, SGD-momentum, Adam, AdamW with nanoVLM's recipe: lr groups, global-norm
//                 clip, warmup + cosine schedule) runs here over the parameter outputs, which
//                 alias the program's weights, so updating them in place trains it.
//   updating      the update is written into the program (LOMO, fused SGD/Adam/AdamW); only the
//                 step's scalars are computed here, as the program's last input `hyper`.
//   forward-only  MeZO (Malladi et al. 2023, arXiv:2305.17333): the trainable weights are inputs,
//                 perturbed in place by +-eps*z and restored bitwise.
//
// Exit codes are the Python worker's, from exit_codes.h, which build.py generates from
// edgebench/figures/status.py.

#include "exit_codes.h"
#include "optimizers.h"
#include "parallel.h"
#include "plan.h"

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

// The plan's `threads` sizes the runtime's pool. The wheel ships libexecutorch_threadpool.so
// but not threadpool.h, and offers no public way to size the pool (thread_parallel_interface.h
// only reads its size): the one private call it has for that, declared as the library defines it.
namespace executorch::extension::threadpool {
class ThreadPool {
 public:
  bool _unsafe_reset_threadpool(uint32_t num_threads);
};
ThreadPool* get_threadpool();
}  // namespace executorch::extension::threadpool

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::extension::Module;
using executorch::extension::TensorPtr;
using executorch::runtime::Error;
using executorch::runtime::EValue;

namespace {

using namespace edgebench;  // the exit codes

volatile std::sig_atomic_t g_signal = 0;

void on_signal(int signum) { g_signal = signum; }

struct Failure : std::runtime_error {  // ends the run with this exit code and event
  int code;
  std::string event;
  Failure(int c, std::string ev, const std::string& what) : std::runtime_error(what), code(c), event(std::move(ev)) {}
};

[[noreturn]] void fail(const std::string& what) { throw Failure(EXIT_ERROR, "error", what); }

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // Python's time.monotonic_ns: one clock for both workers
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

std::string json_number(double v) {
  if (std::isnan(v)) return "NaN";  // what Python's json writes (and reads back)
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// events.jsonl: one flushed line per event, as edgebench.telemetry.trace.TraceWriter writes.
class Events {
 public:
  explicit Events(const std::string& path) : fh_(std::fopen(path.c_str(), "a")) {
    if (!fh_) throw Failure(errno == ENOSPC ? EXIT_NO_SPACE : EXIT_ERROR, "", "cannot open " + path + ": " + std::strerror(errno));
  }
  ~Events() { if (fh_) std::fclose(fh_); }
  void write(const std::string& event, const std::string& fields = "") {
    std::string line = "{\"t_ns\": " + std::to_string(now_ns()) + ", \"event\": " + json_string(event) +
                       (fields.empty() ? "" : ", " + fields) + "}\n";
    if (std::fputs(line.c_str(), fh_) < 0 || std::fflush(fh_) != 0) {
      int err = errno;
      throw Failure(err == ENOSPC ? EXIT_NO_SPACE : EXIT_ERROR, "", std::string("cannot write events.jsonl: ") + std::strerror(err));
    }
  }

 private:
  std::FILE* fh_;
};

std::string error_text(Error e) {
  switch (e) {
    case Error::InvalidArgument: return "InvalidArgument";
    case Error::InvalidProgram: return "InvalidProgram";
    case Error::InvalidState: return "InvalidState";
    case Error::NotFound: return "NotFound";
    case Error::NotSupported: return "NotSupported";
    case Error::NotImplemented: return "NotImplemented";
    case Error::OperatorMissing: return "OperatorMissing";
    case Error::MemoryAllocationFailed: return "MemoryAllocationFailed";
    case Error::AccessFailed: return "AccessFailed";
    default: return "error " + std::to_string(int(e));
  }
}

[[noreturn]] void runtime_failure(Error e, const std::string& where) {
  if (e == Error::MemoryAllocationFailed) throw Failure(EXIT_OOM, "oom", where + ": ExecuTorch could not allocate memory");
  fail(where + ": ExecuTorch " + error_text(e));
}

// One input of the program: its name, dtype and shape, and where each batch holds it.
struct Input {
  std::string name;
  ScalarType dtype;
  std::vector<executorch::aten::SizesType> shape;
  size_t bytes = 0;
  std::vector<uint8_t> data;  // this step's values
};

ScalarType dtype_of(const PlanLine& line) {
  const std::string& name = line.text(1);
  if (name == "int64") return ScalarType::Long;
  if (name == "float32") return ScalarType::Float;
  line.error("dtype " + name + " is not one the worker reads (int64, float32)");
}

size_t element_size(ScalarType t) { return t == ScalarType::Long ? 8 : 4; }

// batches.bin: `count` batches, each the inputs in order, raw little-endian.
class Batches {
 public:
  Batches(const std::string& path, std::vector<Input>& inputs, long long count)
      : fh_(std::fopen(path.c_str(), "rb")), inputs_(inputs), count_(count) {
    if (!fh_) fail(path + ": cannot read the plan's batches (" + std::strerror(errno) + ")");
    for (auto& in : inputs_) per_batch_ += in.bytes;
    std::fseek(fh_, 0, SEEK_END);
    long size = std::ftell(fh_);
    if (count_ < 1 || size != long(per_batch_ * count_))
      fail(path + ": " + std::to_string(size) + " bytes, the plan says " + std::to_string(count_) + " batches of " +
           std::to_string(per_batch_) + "; write the plan again");
  }
  ~Batches() { if (fh_) std::fclose(fh_); }
  // Reads batch `index` (cycling: a run longer than the plan's batches reuses them) into the inputs.
  void load(long long index) {
    std::fseek(fh_, long((index % count_) * per_batch_), SEEK_SET);
    for (auto& in : inputs_) {
      in.data.resize(in.bytes);
      if (std::fread(in.data.data(), 1, in.bytes, fh_) != in.bytes) fail("batches.bin: short read");
    }
  }

 private:
  std::FILE* fh_;
  std::vector<Input>& inputs_;
  long long count_;
  size_t per_batch_ = 0;
};

// nanoVLM's schedule (edgebench.methods.optim.lr_factor): linear warmup, cosine down to a floor.
struct Schedule {
  long long total;
  double warmup_fraction, min_fraction;
  double factor(long long step) const {
    double warmup = std::max(1.0, double(total) * warmup_fraction);
    if (double(step) < warmup) return double(step + 1) / warmup;
    if (step >= total) return min_fraction;
    double ratio = (double(step) - warmup) / std::max(1.0, double(total) - warmup);
    return min_fraction + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (1.0 - min_fraction);
  }
};

struct Param {
  std::string name;
  int group = 0;  // 0 backbones, 1 projector (nanoVLM's higher lr)
  float* data = nullptr;
  size_t numel = 0;
};

uint64_t splitmix64(uint64_t& state) {
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

class Worker {
 public:
  // Every value of the plan is read here, once: a bad one fails the run before its first step.
  Worker(const Plan& plan, const std::string& program_dir) : dir_(program_dir) {
    kind_ = plan.text("kind");
    optimizer_name_ = plan.text("optimizer");
    group_lr_ = {plan.real("group_lr", 0), plan.real("group_lr", 1)};
    schedule_ = {plan.integer("total_steps"), plan.real("warmup_fraction"), plan.real("min_lr_fraction")};
    clip_ = plan.real("clip");
    accumulation_ = std::max(1LL, plan.integer("accumulation"));
    beta1_ = plan.real("betas", 0);
    beta2_ = plan.real("betas", 1);
    weight_decay_ = plan.real("weight_decay");
    if (kind_ == "joint") {  // the update runs here: chosen once
      OptimizerConstants constants{float(plan.real("momentum")), float(beta1_), float(beta2_), float(plan.real("eps")),
                                   float(weight_decay_)};
      optimizer_ = make_optimizer(optimizer_name_, constants);
      if (!optimizer_)
        throw Failure(EXIT_UNSUPPORTED, "unsupported",
                      "optimizer " + optimizer_name_ + " is not in the native worker; use --runtime python");
    }
    seed_ = plan.integer("seed");
    mezo_eps_ = plan.real("mezo_eps");
    for (const PlanLine* line : plan.all("input")) {
      Input in{line->text(0), dtype_of(*line), {}};
      size_t n = 1;
      for (size_t i = 2; i < line->size(); ++i) {
        long long size = line->integer_at_least(i, 1);
        in.shape.push_back(executorch::aten::SizesType(size));
        n *= size_t(size);
      }
      in.bytes = n * element_size(in.dtype);
      inputs_.push_back(std::move(in));
    }
    for (const PlanLine* line : plan.all("param")) {
      Param p;
      p.name = line->text(0);
      p.group = int(line->integer_at_least(1, 0));
      if (size_t(p.group) >= group_lr_.size()) line->error("group " + line->text(1) + " is not 0 or 1");
      p.numel = size_t(line->integer_at_least(2, 0));
      params_.push_back(std::move(p));
    }
    batches_ = std::make_unique<Batches>(plan.dir() + "/" + plan.text("batches"), inputs_, plan.integer("batch_count"));
  }

  void load() {
    std::string pte = dir_ + "/model.pte";
    if (access(pte.c_str(), R_OK) != 0) fail(pte + ": " + std::strerror(errno) + "; export the program (edgebench export) and deploy it");
    module_ = std::make_unique<Module>(pte, Module::LoadMode::Mmap);
    Error e = module_->load_method("forward");
    if (e != Error::Ok) {
      if (e == Error::InvalidProgram || e == Error::InvalidArgument || e == Error::NotFound)
        fail(pte + " is not an ExecuTorch program this runtime can load (" + error_text(e) +
             "); export it again with `edgebench export --backend executorch`");
      runtime_failure(e, "loading " + pte);
    }
    check_inputs(pte);
    if (kind_ == "joint") {
      grad_start_ = index_of("__et_training_gradients_index_forward", pte);
      param_start_ = index_of("__et_training_parameters_index_forward", pte);
      check_names(pte);
    } else if (kind_ == "forward-only") {
      load_weights();
    } else if (kind_ != "updating") {
      fail("native plan: unknown program kind " + kind_);
    }
  }

  // One training step (warmup or measured): returns the loss.
  double step(long long step_index) {
    if (kind_ == "forward-only") return mezo_step(step_index);
    if (kind_ == "updating") return updating_step(step_index);
    double loss = 0.0;
    for (long long part = 0; part < accumulation_; ++part) {
      check_signal();
      batches_->load(step_index * accumulation_ + part);
      auto outputs = run(batch_inputs());
      loss += to_double(outputs[0]) / double(accumulation_);
      bind_params(outputs);
    }
    update(step_index);
    zero_sums();
    return loss;
  }

 private:
  std::string dir_;
  std::string kind_, optimizer_name_;
  std::unique_ptr<Optimizer> optimizer_;  // a joint program's update
  std::vector<double> group_lr_;
  Schedule schedule_{};
  double clip_ = 0.0;
  double beta1_ = 0.0, beta2_ = 0.0, weight_decay_ = 0.0;  // an updating program's hyper input needs them
  long long seed_ = 0;
  double mezo_eps_ = 0.0;
  long long accumulation_ = 1;
  std::vector<Input> inputs_;
  std::vector<Param> params_;
  std::unique_ptr<Batches> batches_;
  std::unique_ptr<Module> module_;
  int64_t grad_start_ = 0, param_start_ = 0;
  std::vector<float*> grads_;  // this call's gradients, accumN's sums (views of the program's arena)
  std::vector<std::vector<float>> weights_;  // forward-only: the trainable weights (inputs)
  uint64_t mezo_state_ = 0;

  void check_signal() {
    if (g_signal) {
      const char* name = g_signal == SIGINT ? "Ctrl-C (SIGINT)" : "SIGTERM";
      throw Failure(EXIT_INTERRUPTED, "interrupted", std::string("stopped by ") + name);
    }
  }

  void check_inputs(const std::string& pte) {
    auto meta = module_->method_meta("forward");
    if (!meta.ok()) runtime_failure(meta.error(), "reading " + pte);
    size_t expected = inputs_.size() + (kind_ == "updating" ? 1 : 0) + (kind_ == "forward-only" ? params_.size() : 0);
    if (meta->num_inputs() != expected)
      fail(pte + ": the program takes " + std::to_string(meta->num_inputs()) + " inputs, the plan gives " +
           std::to_string(expected) + " (is it the program exported for this method?); export it again for this run");
    for (size_t i = 0; i < inputs_.size(); ++i) {
      auto tm = meta->input_tensor_meta(i);
      if (!tm.ok()) fail(pte + ": input " + std::to_string(i) + " (" + inputs_[i].name + ") is not a tensor");
      auto sizes = tm->sizes();
      std::vector<executorch::aten::SizesType> got(sizes.begin(), sizes.end());
      if (got != inputs_[i].shape || tm->scalar_type() != inputs_[i].dtype) {
        auto show = [](const std::vector<executorch::aten::SizesType>& s) {
          std::string out = "[";
          for (size_t k = 0; k < s.size(); ++k) out += (k ? ", " : "") + std::to_string(s[k]);
          return out + "]";
        };
        fail(pte + ": " + inputs_[i].name + " was exported as " + show(got) + ", the batch is " + show(inputs_[i].shape) +
             "; export again with this batch size / text length / image size");
      }
    }
  }

  int64_t index_of(const std::string& method, const std::string& pte) {
    auto result = module_->execute(method);
    if (!result.ok())
      fail(pte + " is not a training program (no " + method + "): export it with `edgebench export --backend executorch` "
           "for a backprop method, or use the forward-only export for MeZO");
    return (*result)[0].toInt();
  }

  // The program's trainable parameters, in its order, each with the plan's lr group: a plan
  // written for another program is refused (it would update the wrong weights).
  void check_names(const std::string& pte) {
    auto names = module_->execute("__et_training_fqn_forward");
    if (!names.ok()) return;  // a program without names: the plan's order, sizes still checked
    if (names->size() != params_.size())
      fail(pte + " trains " + std::to_string(names->size()) + " parameters, the plan names " +
           std::to_string(params_.size()) + "; write the plan again for this program");
    std::map<std::string, Param> by_name;
    for (auto& p : params_) by_name[p.name] = p;
    std::vector<Param> ordered;
    for (const auto& value : *names) {
      std::string name(value.toString());
      auto it = by_name.find(name);
      if (it == by_name.end())
        fail(pte + " trains " + name + ", which the plan does not name; write the plan again for this program");
      ordered.push_back(it->second);
    }
    params_ = std::move(ordered);
  }

  std::vector<EValue> batch_inputs() {
    std::vector<EValue> values;
    holders_.clear();
    for (auto& in : inputs_) {
      holders_.push_back(executorch::extension::from_blob(in.data.data(), in.shape, in.dtype));
      values.emplace_back(*holders_.back());
    }
    return values;
  }
  std::vector<TensorPtr> holders_;

  std::vector<EValue> run(const std::vector<EValue>& inputs) {
    auto result = module_->execute("forward", inputs);
    if (!result.ok()) runtime_failure(result.error(), "running forward");
    return std::move(*result);
  }

  static double to_double(const EValue& v) {
    const Tensor& t = v.toTensor();
    return double(t.const_data_ptr<float>()[0]);
  }

  void bind_params(const std::vector<EValue>& outputs) {
    size_t n = size_t(param_start_ - grad_start_);
    if (params_.size() != n || outputs.size() < size_t(param_start_) + n)
      fail("the program returns " + std::to_string(n) + " gradients, the plan names " + std::to_string(params_.size()) +
           " trainable parameters; write the plan again for this program");
    grads_.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const Tensor& g = outputs[size_t(grad_start_) + i].toTensor();
      const Tensor& p = outputs[size_t(param_start_) + i].toTensor();
      if (params_[i].numel == 0) params_[i].numel = size_t(p.numel());  // the plan leaves a joint program's sizes to it
      if (size_t(p.numel()) != params_[i].numel || g.numel() != p.numel())
        fail("parameter " + params_[i].name + ": the program's has " + std::to_string(p.numel()) +
             " elements, the plan says " + std::to_string(params_[i].numel) + "; write the plan again for this program");
      grads_[i] = g.mutable_data_ptr<float>();
      params_[i].data = p.mutable_data_ptr<float>();  // the program's own weights
    }
  }

  // accumN: the program adds each micro-batch's gradients into sums of its own
  // (exporters.et_methods.sum_gradients) and returns those; zeroed after the step's update.
  void zero_sums() {
    if (accumulation_ == 1) return;
    for (size_t i = 0; i < params_.size(); ++i) std::memset(grads_[i], 0, params_[i].numel * sizeof(float));
  }

  // The methods' update over the program's weights: clip the global norm, then the optimizer.
  void update(long long step_index) {
    double factor = schedule_.factor(step_index);
    // accumN's gradients are the program's sums over N micro-batches: divided by N (eager's loss/N)
    float parts = float(accumulation_);
    Gradients grads{{grads_.begin(), grads_.end()}, 1.0f / parts};
    if (clip_ > 0) {  // torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), at most 1
      double total = 0.0;
      for (size_t i = 0; i < params_.size(); ++i) {
        const float* g = grads_[i];
        total += parallel_sum(params_[i].numel, [g](size_t k) { return double(g[k]) * double(g[k]); });
      }
      float norm = float(std::sqrt(total)) / parts;
      grads.scale = float(std::min(1.0, double(float(clip_) / (norm + 1e-6f)))) / parts;
    }
    std::vector<Weights> weights;
    for (const Param& p : params_) weights.push_back({p.data, p.numel, float(group_lr_[size_t(p.group)] * factor)});
    optimizer_->step(weights, grads);
  }

  // The program applies the update; this step's scalars are its last input (see
  // edgebench.backends.et_optimizers.UpdatingProgram.hyper: per group decay and step, then
  // Adam's sqrt(1 - beta2^t)).
  double updating_step(long long step_index) {
    check_signal();
    batches_->load(step_index);
    double factor = schedule_.factor(step_index);
    bool adam = optimizer_name_ == "adam" || optimizer_name_ == "adamw";
    double b1 = beta1_, b2 = beta2_, wd = weight_decay_;
    double t = double(step_index + 1);
    for (int g = 0; g < 2; ++g) {
      double lr = group_lr_[size_t(g)] * factor;
      hyper_[2 * g] = float(1.0 - lr * wd);
      hyper_[2 * g + 1] = float(adam ? -lr / (1.0 - std::pow(b1, t)) : -lr);
    }
    hyper_[4] = float(adam ? std::sqrt(1.0 - std::pow(b2, t)) : 1.0);
    auto inputs = batch_inputs();
    auto hyper = executorch::extension::from_blob(hyper_, {5}, ScalarType::Float);
    inputs.emplace_back(*hyper);
    auto outputs = run(inputs);
    return to_double(outputs[0]);
  }
  float hyper_[5] = {0, 0, 0, 0, 0};

  // MeZO's weights: trainable_init.bin, float32 in the plan's parameter order.
  void load_weights() {
    std::string path = dir_ + "/trainable_init.bin";
    std::FILE* fh = std::fopen(path.c_str(), "rb");
    if (!fh) fail(path + ": " + std::strerror(errno) + "; export the forward-only program again (edgebench export)");
    weights_.resize(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      weights_[i].resize(params_[i].numel);
      if (std::fread(weights_[i].data(), sizeof(float), params_[i].numel, fh) != params_[i].numel) {
        std::fclose(fh);
        fail(path + ": shorter than the plan's trainable parameters; export the program again");
      }
    }
    std::fclose(fh);
    mezo_state_ = uint64_t(seed_) * 0x9E3779B97F4A7C15ULL + 1;
  }

  // theta += scale * z; with `record`, the elements whose rounding would not undo exactly keep
  // their old value, so the weights come back bitwise (edgebench.methods.exact).
  void perturb(uint64_t seed, float scale, std::vector<std::vector<std::pair<uint32_t, float>>>* records) {
    for (size_t i = 0; i < weights_.size(); ++i) {
      Normal z{seed * 1000003ULL + i};
      auto& w = weights_[i];
      for (size_t k = 0; k < w.size(); ++k) {
        float d = scale * z.next();
        float before = w[k];
        w[k] = before + d;
        if (records && w[k] - d != before) (*records)[i].emplace_back(uint32_t(k), before);
      }
    }
  }

  void undo(uint64_t seed, float scale, const std::vector<std::vector<std::pair<uint32_t, float>>>& records) {
    for (size_t i = 0; i < weights_.size(); ++i) {
      Normal z{seed * 1000003ULL + i};
      auto& w = weights_[i];
      for (size_t k = 0; k < w.size(); ++k) w[k] -= scale * z.next();
      for (const auto& [k, before] : records[i]) w[k] = before;
    }
  }

  double loss_at(uint64_t seed, float scale) {
    std::vector<std::vector<std::pair<uint32_t, float>>> records(weights_.size());
    perturb(seed, scale, &records);
    auto inputs = batch_inputs();
    std::vector<TensorPtr> weight_tensors;
    for (size_t i = 0; i < weights_.size(); ++i) {
      weight_tensors.push_back(executorch::extension::from_blob(weights_[i].data(), {executorch::aten::SizesType(weights_[i].size())}, ScalarType::Float));
    }
    auto meta = module_->method_meta("forward");
    for (size_t i = 0; i < weights_.size(); ++i) {  // each weight in the shape the program declares
      auto tm = meta->input_tensor_meta(inputs_.size() + i);
      auto sizes = tm->sizes();
      weight_tensors[i] = executorch::extension::from_blob(
          weights_[i].data(), std::vector<executorch::aten::SizesType>(sizes.begin(), sizes.end()), ScalarType::Float);
      inputs.emplace_back(*weight_tensors[i]);
    }
    double loss = to_double(run(inputs)[0]);
    undo(seed, scale, records);
    return loss;
  }

  double mezo_step(long long step_index) {
    check_signal();
    batches_->load(step_index);
    float eps = float(mezo_eps_);
    uint64_t seed = splitmix64(mezo_state_) % 2147483647ULL;
    double plus = loss_at(seed, eps);
    check_signal();
    double minus = loss_at(seed, -eps);
    double projected = (plus - minus) / (2.0 * double(eps));
    double lr = group_lr_[0] * schedule_.factor(step_index);
    perturb(seed, float(-lr * projected), nullptr);
    return (plus + minus) / 2.0;
  }
};

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
  if (expected && getppid() != std::atoi(expected)) std::exit(EXIT_INTERRUPTED);
}

void volunteer_for_oom_kill() {  // the OOM killer takes the worker, never the supervisor
  if (std::FILE* fh = std::fopen("/proc/self/oom_score_adj", "w")) {
    std::fputs("1000", fh);
    std::fclose(fh);
  }
}

// A plan that cannot be read ends the run as an error naming its line.
int train(const std::string& plan_path, const std::string& program_dir, Events& events) try {
  Plan plan = Plan::read(plan_path);
  const PlanLine* predicted = plan.find("predicted");  // the host's prediction, JSON, echoed as it is
  events.write("predicted", std::string("\"memory\": ") + (predicted && !predicted->rest().empty() ? predicted->rest() : "null"));
  long long threads = plan.integer("threads");
  if (threads > 0) executorch::extension::threadpool::get_threadpool()->_unsafe_reset_threadpool(uint32_t(threads));
  events.write("load_begin");
  Worker worker(plan, program_dir);
  worker.load();
  events.write("load_end");
  long long warmup = plan.integer("warmup_steps"), steps = plan.integer("steps");
  double duration = plan.real("duration_s");  // 0: run `steps` measured steps
  int64_t deadline = duration > 0 ? now_ns() + int64_t(duration * 1e9) : -1;  // from here, as the Python worker
  for (long long step = 0;; ++step) {
    bool measure = step >= warmup;
    if (measure) {
      if (deadline < 0 && step - warmup >= steps) break;
      if (deadline > 0 && now_ns() >= deadline) break;
    }
    const char* phase = measure ? "measure" : "warmup";
    int64_t begin = now_ns();
    events.write("step_begin", "\"step\": " + std::to_string(step) + ", \"phase\": \"" + phase + "\"");
    double loss = worker.step(step);
    int64_t end = now_ns();
    events.write("step_end", "\"step\": " + std::to_string(step) + ", \"phase\": \"" + phase + "\", \"loss\": " +
                             json_number(loss) + ", \"duration_s\": " + json_number(double(end - begin) / 1e9));
    if (!std::isfinite(loss)) {
      events.write("diverged", "\"step\": " + std::to_string(step) + ", \"loss\": " + json_number(loss));
      return EXIT_DIVERGED;
    }
  }
  return EXIT_OK;
} catch (const PlanError& e) {
  fail(e.what());
}

// --rates: the step-time model's rates (edgebench/methods/device_speed.py's fields), each taken
// the way this worker spends time in training, the fastest of `repeats` after one warm-up:
//   matmul_gflops     RATES_DIR/fp32.pte (edgebench/native/rates.py: per shape, a linear layer's
//                     forward and its two backward products, lowered as training programs are);
//   bf16_matmul_cost  RATES_DIR/bf16.pte's time over fp32.pte's (null, with why, if it cannot run);
//   pass_ns           the updates' loop shape: read two fp32 arrays, write one (parallel_each);
//   normal_ns         MeZO's generator (Normal), one thread, as perturb draws.
double fastest_s(long long repeats, const std::function<void()>& call) {
  call();
  double best = INFINITY;
  for (long long i = 0; i < repeats; ++i) {
    int64_t begin = now_ns();
    call();
    best = std::min(best, double(now_ns() - begin) / 1e9);
  }
  return best;
}

struct Matmuls {
  double seconds, flops;
};

// A rates program's inputs are x (rows, inner) and g (rows, columns) per shape, then each
// shape's weight w (inner, columns); they are filled with normal samples in the dtype each declares.
Matmuls time_matmuls(const std::string& pte, long long repeats) {
  if (access(pte.c_str(), R_OK) != 0) fail(pte + ": " + std::strerror(errno));
  Module module(pte, Module::LoadMode::Mmap);
  Error e = module.load_method("forward");
  if (e != Error::Ok) runtime_failure(e, "loading " + pte);
  auto meta = module.method_meta("forward");
  if (!meta.ok()) runtime_failure(meta.error(), "reading " + pte);
  size_t n = meta->num_inputs();
  if (n == 0 || n % 3 != 0) fail(pte + ": not a rates program (" + std::to_string(n) + " inputs)");
  std::vector<std::vector<float>> floats(n);
  std::vector<std::vector<uint16_t>> halves(n);
  std::vector<std::vector<executorch::aten::SizesType>> shapes(n);
  std::vector<TensorPtr> tensors;
  std::vector<EValue> inputs;
  Normal z{1};
  for (size_t i = 0; i < n; ++i) {
    auto tm = meta->input_tensor_meta(i);
    if (!tm.ok()) fail(pte + ": input " + std::to_string(i) + " is not a tensor");
    shapes[i].assign(tm->sizes().begin(), tm->sizes().end());
    size_t numel = 1;
    for (auto d : shapes[i]) numel *= size_t(d);
    if (tm->scalar_type() == ScalarType::Float) {
      floats[i].resize(numel);
      for (auto& v : floats[i]) v = z.next();
      tensors.push_back(executorch::extension::from_blob(floats[i].data(), shapes[i], ScalarType::Float));
    } else if (tm->scalar_type() == ScalarType::BFloat16) {
      halves[i].resize(numel);
      for (auto& v : halves[i]) {
        float f = z.next();
        uint32_t bits;
        std::memcpy(&bits, &f, sizeof bits);
        v = uint16_t(bits >> 16);
      }
      tensors.push_back(executorch::extension::from_blob(halves[i].data(), shapes[i], ScalarType::BFloat16));
    } else {
      fail(pte + ": input " + std::to_string(i) + " is neither float32 nor bfloat16");
    }
    inputs.emplace_back(*tensors.back());
  }
  double flops = 0.0;
  for (size_t k = 0; k < n / 3; ++k) {
    const auto &x = shapes[2 * k], &g = shapes[2 * k + 1];
    if (x.size() != 2 || g.size() != 2) fail(pte + ": not a rates program (x and g are matrices)");
    flops += 3.0 * 2.0 * double(x[0]) * double(x[1]) * double(g[1]);
  }
  double seconds = fastest_s(repeats, [&] {
    auto out = module.execute("forward", inputs);
    if (!out.ok()) runtime_failure(out.error(), "running " + pte);
  });
  return {seconds, flops};
}

int rates(const std::string& dir, long long repeats, long long pass_elements, long long normal_elements) {
  if (repeats < 1 || pass_elements < 1 || normal_elements < 1)
    fail("--rates needs --repeats, --pass-elements and --normal-elements, each at least 1");
  Matmuls fp32 = time_matmuls(dir + "/fp32.pte", repeats);
  std::string bf16_cost = "null", unmeasured = "{}";
  try {
    Matmuls bf16 = time_matmuls(dir + "/bf16.pte", repeats);
    bf16_cost = json_number(bf16.seconds / fp32.seconds);
  } catch (const Failure& f) {
    unmeasured = "{\"bf16_matmul_cost\": " + json_string(std::string("ExecuTorch cannot run the bf16 matmuls here: ") + f.what()) + "}";
  }
  size_t n = size_t(pass_elements);
  std::vector<float> a(n, 1.0f), b(n, 2.0f), out(n);
  float *pa = a.data(), *pb = b.data(), *po = out.data();
  double pass_s = fastest_s(repeats, [&] { parallel_each(n, [=](size_t k) { po[k] = pa[k] + pb[k]; }); });
  std::vector<float> samples(static_cast<size_t>(normal_elements));
  Normal z{2};
  double normal_s = fastest_s(repeats, [&] { for (auto& v : samples) v = z.next(); });
  if (!std::isfinite(out[n / 2] + samples[samples.size() / 2])) fail("--rates: a non-finite sample");  // keeps both loops
  std::printf("{\"matmul_gflops\": %s, \"bf16_matmul_cost\": %s, \"pass_ns\": %s, \"normal_ns\": %s, "
              "\"source\": \"measured by the native worker (edgebench-worker --rates)\", \"unmeasured\": %s, "
              "\"threads\": %zu}\n",
              json_number(fp32.flops / fp32.seconds / 1e9).c_str(), bf16_cost.c_str(),
              json_number(pass_s / double(pass_elements) * 1e9).c_str(),
              json_number(normal_s / double(normal_elements) * 1e9).c_str(), unmeasured.c_str(),
              size_t(executorch::extension::get_thread_count()));
  return EXIT_OK;
}

}  // namespace

int main(int argc, char** argv) {
  std::string plan_path, program_dir, out, rates_dir;
  long long repeats = 0, pass_elements = 0, normal_elements = 0;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--program" && i + 1 < argc) program_dir = argv[++i];
    else if (arg == "--rates" && i + 1 < argc) rates_dir = argv[++i];
    else if (arg == "--repeats" && i + 1 < argc) repeats = std::atoll(argv[++i]);
    else if (arg == "--pass-elements" && i + 1 < argc) pass_elements = std::atoll(argv[++i]);
    else if (arg == "--normal-elements" && i + 1 < argc) normal_elements = std::atoll(argv[++i]);
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
  std::unique_ptr<Events> events;
  try {
    events = std::make_unique<Events>(out + "/events.jsonl");
  } catch (const Failure& f) {
    std::fprintf(stderr, "%s\n", f.what());
    return f.code;
  }
  int code = EXIT_ERROR;
  try {
    code = train(plan_path, program_dir, *events);
  } catch (const Failure& f) {
    if (f.code == EXIT_NO_SPACE || f.event.empty()) {
      std::fprintf(stderr, "%s\n", f.what());
      return f.code;
    }
    code = f.code;
    try { events->write(f.event, std::string("\"detail\": ") + json_string(f.what())); } catch (const Failure& g) { return g.code; }
  } catch (const std::bad_alloc&) {
    code = EXIT_OOM;
    try { events->write("oom", "\"detail\": \"std::bad_alloc: the native worker could not allocate memory\""); } catch (...) {}
  } catch (const std::exception& e) {
    try { events->write("error", std::string("\"detail\": ") + json_string(std::string("native worker: ") + e.what())); } catch (...) {}
  }
  // The worker's own peak: the supervisor's ru_maxrss of it would start at the supervisor's RSS
  // (Linux carries the parent's high-water mark across exec).
  long long hwm = vm_hwm_bytes();
  if (hwm > 0) {
    try { events->write("memory", "\"vm_hwm_bytes\": " + std::to_string(hwm)); } catch (...) {}
  }
  return code;
}
