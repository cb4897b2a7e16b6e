// kind joint: forward + backward; outputs [loss, ..., gradients, parameters]. The update (SGD,
// SGD-momentum, Adam, AdamW with nanoVLM's recipe: lr groups, global-norm clip, warmup + cosine
// schedule) runs here over the parameter outputs, which alias the program's weights, so
// updating them in place trains it.
#pragma once

#include "optimizers.h"
#include "program.h"

#include <memory>
#include <string>
#include <vector>

namespace edgebench {

class JointProgram : public Program {
 public:
  JointProgram(const Plan& plan, const std::string& program_dir);
  double step(long long step_index) override;

 private:
  size_t extra_inputs() const override { return 0; }
  void loaded(const std::string& pte) override;

  int64_t index_of(const std::string& method, const std::string& pte);
  void check_names(const std::string& pte);
  void bind_params(const std::vector<EValue>& outputs);
  void zero_sums();
  void update(long long step_index);

  std::unique_ptr<Optimizer> optimizer_;  // the update, chosen once
  int64_t grad_start_ = 0, param_start_ = 0;
  std::vector<float*> grads_;  // this call's gradients, accumN's sums (views of the program's arena)
};

}  // namespace edgebench
