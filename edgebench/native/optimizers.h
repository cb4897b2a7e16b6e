// The updates the native worker runs between program calls, one class per optimizer, each with
// its options and a step(params, grads), as torch.optim computes them (edgebench.methods.optim
// builds those for the Python workers; the losses are held equal by tests/test_native.py).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace edgebench {

// One trained tensor at one update: its weights, updated in place, and this update's lr (its
// group's, times the schedule's factor).
struct Weights {
  float* data;
  size_t numel;
  float lr;
};

// One update's gradients, one per Weights, each element read as data[k] * scale (the clip's
// coefficient and accumN's 1/N, applied as it is read rather than in a pass of its own).
struct Gradients {
  std::vector<const float*> data;
  float scale = 1.0f;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Updates every tensor; the state (momentum buffer, moments) is kept per tensor by its
  // index, so the tensors come in the same order at every step.
  virtual void step(const std::vector<Weights>& params, const Gradients& grads) = 0;
};

// torch.optim.SGD: dampening 0, no Nesterov; weight decay as torch's L2 (g += wd * w after the
// clip, before the momentum buffer); momentum 0 keeps no buffer.
struct SGDOptions {
  float momentum = 0.0f, weight_decay = 0.0f;
};

class SGD : public Optimizer {
 public:
  explicit SGD(SGDOptions options) : options_(options) {}
  void step(const std::vector<Weights>& params, const Gradients& grads) override;

 private:
  SGDOptions options_;
  std::vector<std::vector<float>> momentum_;  // allocated at the first step
};

// torch.optim's single-tensor Adam(W): bias-corrected moments; weight decay decoupled (AdamW's:
// w *= 1 - lr * wd) or L2 (Adam's: g += wd * w before the moments).
struct AdamOptions {
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  bool decoupled = true;
};

class Adam : public Optimizer {
 public:
  explicit Adam(AdamOptions options) : options_(options) {}
  void step(const std::vector<Weights>& params, const Gradients& grads) override;

 private:
  AdamOptions options_;
  long long steps_ = 0;
  std::vector<std::vector<float>> m_, v_;  // allocated at the first step
};

// The constants a plan gives every optimizer (0 where the method has none); the weight decay is
// decoupled or L2 as the plan's optimizer's descriptor says (methods/optimizers.py `decay`).
struct OptimizerConstants {
  float momentum = 0.0f, beta1 = 0.0f, beta2 = 0.0f, eps = 0.0f, weight_decay = 0.0f;
  bool decoupled_decay = false;
};

// The update the plan's `optimizer` names (sgd, sgd-momentum, adam, adamw); nullptr for one the
// worker does not have.
std::unique_ptr<Optimizer> make_optimizer(const std::string& name, const OptimizerConstants& constants);

}  // namespace edgebench
