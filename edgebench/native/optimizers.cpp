#include "optimizers.h"

#include <cmath>

#include "parallel.h"

namespace edgebench {

void SGD::step(const std::vector<Weights>& params, const Gradients& grads) {
  float mu = options_.momentum, wd = options_.weight_decay, c = grads.scale;
  if (mu != 0.0f && momentum_.empty()) momentum_.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    float* w = params[i].data;
    const float* g = grads.data[i];
    float lr = params[i].lr;
    if (mu == 0.0f) {
      parallel_each(params[i].numel, [=](size_t k) { w[k] -= lr * (g[k] * c + wd * w[k]); });
      continue;
    }
    bool first = momentum_[i].empty();  // torch starts the buffer at the first gradient
    if (first) momentum_[i].resize(params[i].numel);
    float* m = momentum_[i].data();
    parallel_each(params[i].numel, [=](size_t k) {
      float gk = g[k] * c + wd * w[k];
      m[k] = first ? gk : m[k] * mu + gk;
      w[k] -= lr * m[k];
    });
  }
}

void Adam::step(const std::vector<Weights>& params, const Gradients& grads) {
  const AdamOptions o = options_;
  double t = double(++steps_);
  float bc2s = float(std::sqrt(1.0 - std::pow(double(o.beta2), t)));
  float one_minus_b1 = 1.0f - o.beta1, one_minus_b2 = 1.0f - o.beta2, c = grads.scale;
  if (m_.empty()) {
    m_.resize(params.size());
    v_.resize(params.size());
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (m_[i].empty()) {
      m_[i].assign(params[i].numel, 0.0f);
      v_[i].assign(params[i].numel, 0.0f);
    }
    float* w = params[i].data;
    const float* g = grads.data[i];
    float* m = m_[i].data();
    float* v = v_[i].data();
    float lr = params[i].lr;
    float step_size = float(double(lr) / (1.0 - std::pow(double(o.beta1), t)));
    float decay = 1.0f - lr * o.weight_decay;
    float l2 = o.decoupled ? 0.0f : o.weight_decay;
    bool decoupled = o.decoupled && o.weight_decay != 0.0f;
    parallel_each(params[i].numel, [=](size_t k) {
      float gk = g[k] * c + l2 * w[k];
      if (decoupled) w[k] *= decay;
      m[k] += one_minus_b1 * (gk - m[k]);  // torch's lerp(grad, 1 - beta1)
      v[k] = v[k] * o.beta2 + one_minus_b2 * gk * gk;
      float denom = std::sqrt(v[k]) / bc2s + o.eps;
      w[k] -= step_size * (m[k] / denom);
    });
  }
}

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, const OptimizerConstants& constants) {
  if (name == "sgd") return std::make_unique<SGD>(SGDOptions{0.0f, constants.weight_decay});
  if (name == "sgd-momentum") return std::make_unique<SGD>(SGDOptions{constants.momentum, constants.weight_decay});
  if (name == "adam" || name == "adamw")
    return std::make_unique<Adam>(AdamOptions{constants.beta1, constants.beta2, constants.eps, constants.weight_decay,
                                              constants.decoupled_decay});
  return nullptr;
}

}  // namespace edgebench
