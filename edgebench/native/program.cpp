#include "program.h"

#include "program_forward_only.h"
#include "program_joint.h"
#include "program_updating.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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

namespace edgebench {

using executorch::aten::Tensor;
using executorch::runtime::Error;

namespace {

ScalarType dtype_of(const PlanLine& line) {
  const std::string& name = line.text(1);
  if (name == "int64") return ScalarType::Long;
  if (name == "float32") return ScalarType::Float;
  line.error("dtype " + name + " is not one the worker reads (int64, float32)");
}

size_t element_size(ScalarType t) { return t == ScalarType::Long ? 8 : 4; }

}  // namespace

Batches::Batches(const std::string& path, std::vector<Input>& inputs, long long count)
    : fh_(std::fopen(path.c_str(), "rb")), inputs_(inputs), count_(count) {
  if (!fh_) fail(path + ": cannot read the plan's batches (" + std::strerror(errno) + ")");
  size_t want = 0;
  bool overflow = false;  // a hand-edited plan's sizes (each in range) can still multiply past 64 bits
  for (auto& in : inputs_) overflow |= __builtin_add_overflow(per_batch_, in.bytes, &per_batch_);
  overflow |= __builtin_mul_overflow(per_batch_, size_t(count_), &want);
  std::fseek(fh_, 0, SEEK_END);
  long size = std::ftell(fh_);
  if (overflow || size != long(want))
    fail(path + ": " + std::to_string(size) + " bytes, the plan says " + std::to_string(count_) + " batches of " +
         std::to_string(per_batch_) + "; write the plan again");
}

Batches::~Batches() {
  if (fh_) std::fclose(fh_);
}

void Batches::load(long long index) {
  std::fseek(fh_, long((index % count_) * per_batch_), SEEK_SET);
  for (auto& in : inputs_) {
    in.data.resize(in.bytes);
    if (std::fread(in.data.data(), 1, in.bytes, fh_) != in.bytes) fail("batches.bin: short read");
  }
}

double Schedule::factor(long long step) const {
  double warmup = std::max(1.0, double(total) * warmup_fraction);
  if (double(step) < warmup) return double(step + 1) / warmup;
  if (step >= total) return min_fraction;
  double ratio = (double(step) - warmup) / std::max(1.0, double(total) - warmup);
  return min_fraction + 0.5 * (1.0 + std::cos(M_PI * ratio)) * (1.0 - min_fraction);
}

Program::Program(const Plan& plan, const std::string& program_dir) : dir_(program_dir) {
  optimizer_name_ = plan.text("optimizer");
  group_lr_ = {plan.real("group_lr", 0), plan.real("group_lr", 1)};
  schedule_ = {plan.integer("total_steps"), plan.real("warmup_fraction"), plan.real("min_lr_fraction")};
  clip_ = plan.real("clip");
  accumulation_ = plan.integer("accumulation");
  beta1_ = plan.real("betas", 0);
  beta2_ = plan.real("betas", 1);
  weight_decay_ = plan.real("weight_decay");
  const std::string& decay = plan.text("weight_decay", 1);
  if (decay != "l2" && decay != "decoupled")
    fail("plan.txt: weight_decay's kind is " + decay + ", not l2 or decoupled; write the plan again");
  decoupled_decay_ = decay == "decoupled";
  seed_ = plan.integer("seed");
  mezo_eps_ = plan.real("mezo_eps");
  for (const PlanLine* line : plan.all("input")) {
    Input in{line->text(0), dtype_of(*line), {}};
    in.bytes = element_size(in.dtype);
    for (size_t i = 2; i < line->size(); ++i) {
      long long size = line->integer(i);
      in.shape.push_back(executorch::aten::SizesType(size));
      if (__builtin_mul_overflow(in.bytes, size_t(size), &in.bytes)) line->error("a batch of this shape is past 64 bits");
    }
    inputs_.push_back(std::move(in));
  }
  for (const PlanLine* line : plan.all("param")) {
    Param p;
    p.name = line->text(0);
    p.group = int(line->integer(1));
    p.numel = size_t(line->integer(2));
    params_.push_back(std::move(p));
  }
  batches_ = std::make_unique<Batches>(plan.dir() + "/" + plan.text("batches"), inputs_, plan.integer("batch_count"));
}

void Program::load() {
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
  loaded(pte);
}

void Program::check_inputs(const std::string& pte) {
  auto meta = module_->method_meta("forward");
  if (!meta.ok()) runtime_failure(meta.error(), "reading " + pte);
  size_t expected = inputs_.size() + extra_inputs();
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

std::vector<EValue> Program::batch_inputs() {
  std::vector<EValue> values;
  holders_.clear();
  for (auto& in : inputs_) {
    holders_.push_back(executorch::extension::from_blob(in.data.data(), in.shape, in.dtype));
    values.emplace_back(*holders_.back());
  }
  return values;
}

std::vector<EValue> Program::run(const std::vector<EValue>& inputs) {
  auto result = module_->execute("forward", inputs);
  if (!result.ok()) runtime_failure(result.error(), "running forward");
  return std::move(*result);
}

double Program::to_double(const EValue& v) {
  const Tensor& t = v.toTensor();
  return double(t.const_data_ptr<float>()[0]);
}

void Program::point_at(Param& p, const Tensor& t) {
  if (t.scalar_type() == ScalarType::BFloat16) {  // bf16 trained weights: the program updates them itself
    p.dtype = "BF16";
    p.element_bytes = 2;
  } else if (t.scalar_type() != ScalarType::Float) {
    fail("trained weight " + p.name + " has a dtype the worker does not hold (float32, bf16)");
  }
  p.data = static_cast<float*>(t.mutable_data_ptr());
  p.numel = size_t(t.numel());
  p.shape.assign(t.sizes().begin(), t.sizes().end());
}

std::unique_ptr<Program> make_program(const Plan& plan, const std::string& program_dir) {
  std::string kind = plan.text("kind");
  if (kind == "joint") return std::make_unique<JointProgram>(plan, program_dir);
  if (kind == "updating") return std::make_unique<UpdatingProgram>(plan, program_dir);
  if (kind == "forward-only") return std::make_unique<ForwardOnlyProgram>(plan, program_dir);
  fail("native plan: unknown program kind " + kind);
}

int train(const Plan& plan, const std::string& program_dir, const std::string& out_dir, Events& events) try {
  const PlanLine* predicted = plan.find("predicted");  // the host's prediction, JSON, echoed as it is
  events.write("predicted", std::string("\"memory\": ") + (predicted && !predicted->rest().empty() ? predicted->rest() : "null"));
  long long threads = plan.integer("threads");
  if (threads > 0) executorch::extension::threadpool::get_threadpool()->_unsafe_reset_threadpool(uint32_t(threads));
  events.write("load_begin");
  std::unique_ptr<Program> program = make_program(plan, program_dir);
  program->load();
  events.write("load_end");
  long long warmup = plan.integer("warmup_steps"), steps = plan.integer("steps");
  double duration = plan.real("duration_s");  // 0: run `steps` measured steps
  Evaluation evaluation(plan, out_dir);
  int64_t deadline = duration > 0 ? now_ns() + int64_t(duration * 1e9) : -1;  // from here, as the Python worker
  LossWatch watch;
  long long step = 0;
  for (;; ++step) {
    if (evaluation.due(step)) evaluation.run(step, program->params(), events);  // warmup steps count
    bool measure = step >= warmup;
    if (measure) {
      if (deadline < 0 && step - warmup >= steps) break;
      if (deadline > 0 && now_ns() >= deadline) break;
    }
    const char* phase = measure ? "measure" : "warmup";
    int64_t begin = now_ns();
    events.write("step_begin", "\"step\": " + std::to_string(step) + ", \"phase\": \"" + phase + "\"");
    double loss = program->step(step);
    int64_t end = now_ns();
    events.write("step_end", "\"step\": " + std::to_string(step) + ", \"phase\": \"" + phase + "\", \"loss\": " +
                             json_number(loss) + ", \"duration_s\": " + json_number(double(end - begin) / 1e9));
    if (watch.diverged(loss)) {
      events.write("diverged", "\"step\": " + std::to_string(step) + ", \"loss\": " + json_number(loss));
      return EXIT_DIVERGED;
    }
  }
  if (evaluation.wanted() && evaluation.last() != step) evaluation.run(step, program->params(), events);  // after the last
  return EXIT_OK;
} catch (const PlanError& e) {
  fail(e.what());
}

}  // namespace edgebench
