#include "program_updating.h"

#include <cmath>

namespace edgebench {

// This step's scalars, the program's last input (see
// edgebench.backends.et_optimizers.UpdatingProgram.hyper: per group decay and step, then
// Adam's sqrt(1 - beta2^t)). Only decoupled decay is a scalar here: L2 is baked into the program.
double UpdatingProgram::step(long long step_index) {
  check_signal();
  batches_->load(step_index);
  double factor = schedule_.factor(step_index);
  bool adam = optimizer_name_ == "adam" || optimizer_name_ == "adamw";
  double b1 = beta1_, b2 = beta2_, wd = decoupled_decay_ ? weight_decay_ : 0.0;
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
  // [loss, the trained weights in the plan's order, optimizer state]: the weights, which an
  // evaluation point saves, are the program's own (its memory plan)
  if (outputs.size() < 1 + params_.size())
    fail("the program returns " + std::to_string(outputs.size()) + " outputs, fewer than the loss and the plan's " +
         std::to_string(params_.size()) + " trained parameters; write the plan again for this program");
  for (size_t i = 0; i < params_.size(); ++i) point_at(params_[i], outputs[1 + i].toTensor());
  return to_double(outputs[0]);
}

}  // namespace edgebench
