#include "program_joint.h"

#include "parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

namespace edgebench {

using executorch::aten::Tensor;

JointProgram::JointProgram(const Plan& plan, const std::string& program_dir) : Program(plan, program_dir) {
  OptimizerConstants constants{float(plan.real("momentum")), float(beta1_), float(beta2_), float(plan.real("eps")),
                               float(weight_decay_), decoupled_decay_};
  optimizer_ = make_optimizer(optimizer_name_, constants);
  if (!optimizer_)
    throw Failure(EXIT_UNSUPPORTED, "unsupported",
                  "optimizer " + optimizer_name_ + " is not in the native worker; use --runtime python");
}

void JointProgram::loaded(const std::string& pte) {
  grad_start_ = index_of("__et_training_gradients_index_forward", pte);
  param_start_ = index_of("__et_training_parameters_index_forward", pte);
  check_names(pte);
}

double JointProgram::step(long long step_index) {
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

int64_t JointProgram::index_of(const std::string& method, const std::string& pte) {
  auto result = module_->execute(method);
  if (!result.ok())
    fail(pte + " is not a training program (no " + method + "): export it with `edgebench export --backend executorch` "
         "for a backprop method, or use the forward-only export for MeZO");
  return (*result)[0].toInt();
}

// The program's trainable parameters, in its order, each with the plan's lr group: a plan
// written for another program is refused (it would update the wrong weights).
void JointProgram::check_names(const std::string& pte) {
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

void JointProgram::bind_params(const std::vector<EValue>& outputs) {
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
    point_at(params_[i], p);  // the program's own weights
    if (p.scalar_type() != ScalarType::Float || g.scalar_type() != ScalarType::Float)
      fail("parameter " + params_[i].name + ": the worker's optimizers update float32 weights only");
  }
}

// accumN: the program adds each micro-batch's gradients into sums of its own
// (exporters.et_methods.sum_gradients) and returns those; zeroed after the step's update.
void JointProgram::zero_sums() {
  if (accumulation_ == 1) return;
  for (size_t i = 0; i < params_.size(); ++i) std::memset(grads_[i], 0, params_[i].numel * sizeof(float));
}

// The methods' update over the program's weights: clip the global norm, then the optimizer.
void JointProgram::update(long long step_index) {
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

}  // namespace edgebench
