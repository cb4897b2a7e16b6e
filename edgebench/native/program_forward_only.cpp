#include "program_forward_only.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "parallel.h"

namespace edgebench {

// MeZO's weights: trainable_init.bin, float32 in the plan's parameter order.
void ForwardOnlyProgram::loaded(const std::string&) {
  std::string path = dir_ + "/trainable_init.bin";
  std::FILE* fh = std::fopen(path.c_str(), "rb");
  if (!fh) fail(path + ": " + std::strerror(errno) + "; export the forward-only program again (edgebench export)");
  std::fseek(fh, 0, SEEK_END);
  size_t left = size_t(std::max(0L, std::ftell(fh))) / sizeof(float);  // held to the file before allocating
  std::rewind(fh);
  weights_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    size_t numel = params_[i].numel;
    bool read = numel <= left;
    if (read) {
      left -= numel;
      weights_[i].resize(numel);
      read = std::fread(weights_[i].data(), sizeof(float), numel, fh) == numel;
    }
    if (!read) {
      std::fclose(fh);
      fail(path + ": shorter than the plan's trainable parameters; export the program again");
    }
  }
  std::fclose(fh);
  auto meta = module_->method_meta("forward");
  for (size_t i = 0; i < params_.size(); ++i) {  // what an evaluation point saves: the weights held here
    params_[i].data = weights_[i].data();
    auto sizes = meta->input_tensor_meta(inputs_.size() + i)->sizes();
    params_[i].shape.assign(sizes.begin(), sizes.end());
  }
  mezo_state_ = uint64_t(seed_) * 0x9E3779B97F4A7C15ULL + 1;
}

// theta += scale * z; with `records`, the elements whose rounding would not undo exactly keep
// their old value, so the weights come back bitwise (edgebench.methods.exact).
void ForwardOnlyProgram::perturb(uint64_t seed, float scale, Records* records) {
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

void ForwardOnlyProgram::undo(uint64_t seed, float scale, const Records& records) {
  for (size_t i = 0; i < weights_.size(); ++i) {
    Normal z{seed * 1000003ULL + i};
    auto& w = weights_[i];
    for (size_t k = 0; k < w.size(); ++k) w[k] -= scale * z.next();
    for (const auto& [k, before] : records[i]) w[k] = before;
  }
}

double ForwardOnlyProgram::loss_at(uint64_t seed, float scale) {
  Records records(weights_.size());
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

double ForwardOnlyProgram::step(long long step_index) {
  check_signal();
  batches_->load(step_index);
  float eps = float(mezo_eps_);
  uint64_t seed = splitmix64(mezo_state_) % 2147483647ULL;
  double plus = loss_at(seed, eps);
  check_signal();
  double minus = loss_at(seed, -eps);
  double projected = (plus - minus) / (2.0 * double(eps));
  double lr = group_lr_[0] * schedule_.factor(step_index);
  if (weight_decay_ != 0.0) {  // SGD's L2 on the estimate, as edgebench.methods.mezo: w *= 1 - lr * wd
    float decay = float(1.0 - lr * weight_decay_);
    for (auto& w : weights_) parallel_each(w.size(), [p = w.data(), decay](size_t k) { p[k] *= decay; });
  }
  perturb(seed, float(-lr * projected), nullptr);
  return (plus + minus) / 2.0;
}

}  // namespace edgebench
