// What the three program kinds share (program_joint.h, program_updating.h,
// program_forward_only.h): the plan's values, each read once at load, the batches, loading
// model.pte and checking its inputs against the plan, and one call of its `forward`; and the
// run itself (train), which writes the step events and evaluation points whatever the kind.
#pragma once

#include "common.h"
#include "evaluation.h"
#include "plan.h"

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace edgebench {

using executorch::aten::ScalarType;
using executorch::extension::Module;
using executorch::extension::TensorPtr;
using executorch::runtime::EValue;

// One input of the program: its name, dtype and shape, and where each batch holds it.
struct Input {
  std::string name;
  ScalarType dtype;
  std::vector<executorch::aten::SizesType> shape;
  size_t bytes = 0;
  std::vector<uint8_t> data;  // this step's values
};

// batches.bin: `count` batches, each the inputs in order, raw little-endian.
class Batches {
 public:
  Batches(const std::string& path, std::vector<Input>& inputs, long long count);
  ~Batches();
  // Reads batch `index` (cycling: a run longer than the plan's batches reuses them) into the inputs.
  void load(long long index);

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
  double factor(long long step) const;
};

class Program {
 public:
  // The plan's values are read here, once, whatever the kind uses (a joint program's optimizer
  // constants in its own): a bad one fails the run before its first step.
  Program(const Plan& plan, const std::string& program_dir);
  virtual ~Program() = default;
  // model.pte, its inputs checked against the plan, then this kind's own set-up.
  void load();
  // One training step (warmup or measured): returns the loss.
  virtual double step(long long step_index) = 0;
  // The trained weights (a joint or updating program's own, after its last call; MeZO's here).
  const std::vector<Param>& params() const { return params_; }

 protected:
  // How many inputs the program takes after the batch's (an updating program's hyper, a
  // forward-only program's weights).
  virtual size_t extra_inputs() const = 0;
  virtual void loaded(const std::string& pte) = 0;

  std::vector<EValue> batch_inputs();  // this step's batch, as the program's first inputs
  std::vector<EValue> run(const std::vector<EValue>& inputs);
  static double to_double(const EValue& v);
  static void point_at(Param& p, const executorch::aten::Tensor& t);  // p's data, size and shape are t's

  std::string dir_;
  std::string optimizer_name_;
  std::vector<double> group_lr_;
  Schedule schedule_{};
  double clip_ = 0.0;
  double beta1_ = 0.0, beta2_ = 0.0, weight_decay_ = 0.0;
  bool decoupled_decay_ = false;  // the plan's weight_decay kind: decoupled, else L2
  long long seed_ = 0;
  double mezo_eps_ = 0.0;
  long long accumulation_ = 1;
  std::vector<Input> inputs_;
  std::vector<Param> params_;
  std::unique_ptr<Batches> batches_;
  std::unique_ptr<Module> module_;

 private:
  void check_inputs(const std::string& pte);
  std::vector<TensorPtr> holders_;  // batch_inputs' tensors, alive until the next step
};

// The program the plan's `kind` names, its plan read.
std::unique_ptr<Program> make_program(const Plan& plan, const std::string& program_dir);

// Runs the plan (its warmup and measured steps, or its duration) and writes its events, and
// the weights of its evaluation points into `out_dir`; returns the exit code. A line the plan
// lacks ends the run as an error naming it.
int train(const Plan& plan, const std::string& program_dir, const std::string& out_dir, Events& events);

}  // namespace edgebench
