// Held-out evaluation points, as the Python worker's Evaluation keeps them for an exported
// program (edgebench/runner/worker.py): the program computes its loss only, so at each point
// the run saves the trained weights (safetensors) and the host evaluates them after the run
// (edgebench.results.heldout). The worker cannot know the held-out figure, so a target never
// stops it early.
#pragma once

#include "common.h"
#include "plan.h"

#include <cstdint>
#include <string>
#include <vector>

namespace edgebench {

// A trained parameter: what the update changes and an evaluation point saves.
struct Param {
  std::string name;
  int group = 0;  // 0 backbones, 1 projector (nanoVLM's higher lr)
  float* data = nullptr;  // float32 elements, or bf16 ones where `dtype` says BF16 (an updating program's own)
  size_t numel = 0;
  std::vector<int64_t> shape;  // the program's; empty: saved flat ([numel])
  const char* dtype = "F32";  // safetensors' name of the stored dtype
  size_t element_bytes = sizeof(float);
};

// `params` as safetensors (8-byte little-endian header length, the JSON header padded with
// spaces to a multiple of 8, then each tensor's float32 data in order), as
// edgebench.model.checkpoint.write_tensors_file writes it. Written to `path`.partial and
// renamed when whole, so a full disk never leaves a truncated file that looks saved. Throws
// std::runtime_error saying why it could not.
void write_safetensors(const std::string& path, const std::vector<Param>& params);

class Evaluation {
 public:
  // The plan's `eval_every` (0: none) and `eval_weights` (the file name around the step:
  // PREFIX WIDTH SUFFIX, from edgebench.runner.worker.EVAL_WEIGHTS); files go in `out_dir`.
  Evaluation(const Plan& plan, std::string out_dir);
  bool wanted() const { return every_ > 0; }
  bool due(long long steps) const { return wanted() && steps % every_ == 0; }
  long long last() const { return last_; }
  std::string file(long long steps) const;
  // The point after `steps` steps: the weights saved (none at 0: they are the exported ones,
  // which the host builds itself) and an `eval_weights` event; a write that fails is an
  // `eval_failed` event and the run goes on without evaluations.
  void run(long long steps, const std::vector<Param>& params, Events& events);

 private:
  long long every_ = 0, width_ = 0, last_ = -1;
  std::string prefix_, suffix_, out_dir_;
};

}  // namespace edgebench
