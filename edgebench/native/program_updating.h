// kind updating: the update is written into the program (LOMO, fused SGD/Adam/AdamW); only the
// step's scalars are computed here, as the program's last input `hyper`.
#pragma once

#include "program.h"

#include <string>

namespace edgebench {

class UpdatingProgram : public Program {
 public:
  using Program::Program;
  double step(long long step_index) override;

 private:
  size_t extra_inputs() const override { return 1; }  // hyper
  void loaded(const std::string&) override {}

  float hyper_[5] = {0, 0, 0, 0, 0};
};

}  // namespace edgebench
