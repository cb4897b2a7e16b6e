// kind forward-only: MeZO (Malladi et al. 2023, arXiv:2305.17333). The trainable weights are
// inputs, perturbed in place by +-eps*z and restored bitwise.
#pragma once

#include "program.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace edgebench {

class ForwardOnlyProgram : public Program {
 public:
  using Program::Program;
  double step(long long step_index) override;

 private:
  using Records = std::vector<std::vector<std::pair<uint32_t, float>>>;  // per weight: (element, old value)

  size_t extra_inputs() const override { return params_.size(); }  // the weights
  void loaded(const std::string& pte) override;

  void perturb(uint64_t seed, float scale, Records* records);
  void undo(uint64_t seed, float scale, const Records& records);
  double loss_at(uint64_t seed, float scale);

  std::vector<std::vector<float>> weights_;  // the trainable weights, in the plan's order
  uint64_t mezo_state_ = 0;
};

}  // namespace edgebench
