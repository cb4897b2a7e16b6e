#include "rates.h"

#include "common.h"
#include "parallel.h"

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

namespace edgebench {

using executorch::aten::ScalarType;
using executorch::extension::Module;
using executorch::extension::TensorPtr;
using executorch::runtime::Error;
using executorch::runtime::EValue;

namespace {

double fastest_s(long long repeats, const std::function<void()>& call) {
  call();
  double best = INFINITY;
  for (long long i = 0; i < repeats; ++i) {
    int64_t begin = now_ns();
    call();
    best = std::min(best, double(now_ns() - begin) / 1e9);
  }
  return best;
}

struct Matmuls {
  double seconds, flops;
};

// A rates program's inputs are x (rows, inner) and g (rows, columns) per shape, then each
// shape's weight w (inner, columns); they are filled with normal samples in the dtype each declares.
Matmuls time_matmuls(const std::string& pte, long long repeats) {
  if (access(pte.c_str(), R_OK) != 0) fail(pte + ": " + std::strerror(errno));
  Module module(pte, Module::LoadMode::Mmap);
  Error e = module.load_method("forward");
  if (e != Error::Ok) runtime_failure(e, "loading " + pte);
  auto meta = module.method_meta("forward");
  if (!meta.ok()) runtime_failure(meta.error(), "reading " + pte);
  size_t n = meta->num_inputs();
  if (n == 0 || n % 3 != 0) fail(pte + ": not a rates program (" + std::to_string(n) + " inputs)");
  std::vector<std::vector<float>> floats(n);
  std::vector<std::vector<uint16_t>> halves(n);
  std::vector<std::vector<executorch::aten::SizesType>> shapes(n);
  std::vector<TensorPtr> tensors;
  std::vector<EValue> inputs;
  Normal z{1};
  for (size_t i = 0; i < n; ++i) {
    auto tm = meta->input_tensor_meta(i);
    if (!tm.ok()) fail(pte + ": input " + std::to_string(i) + " is not a tensor");
    shapes[i].assign(tm->sizes().begin(), tm->sizes().end());
    size_t numel = 1;
    for (auto d : shapes[i]) numel *= size_t(d);
    if (tm->scalar_type() == ScalarType::Float) {
      floats[i].resize(numel);
      for (auto& v : floats[i]) v = z.next();
      tensors.push_back(executorch::extension::from_blob(floats[i].data(), shapes[i], ScalarType::Float));
    } else if (tm->scalar_type() == ScalarType::BFloat16) {
      halves[i].resize(numel);
      for (auto& v : halves[i]) {
        float f = z.next();
        uint32_t bits;
        std::memcpy(&bits, &f, sizeof bits);
        v = uint16_t(bits >> 16);
      }
      tensors.push_back(executorch::extension::from_blob(halves[i].data(), shapes[i], ScalarType::BFloat16));
    } else {
      fail(pte + ": input " + std::to_string(i) + " is neither float32 nor bfloat16");
    }
    inputs.emplace_back(*tensors.back());
  }
  double flops = 0.0;
  for (size_t k = 0; k < n / 3; ++k) {
    const auto &x = shapes[2 * k], &g = shapes[2 * k + 1];
    if (x.size() != 2 || g.size() != 2) fail(pte + ": not a rates program (x and g are matrices)");
    flops += 3.0 * 2.0 * double(x[0]) * double(x[1]) * double(g[1]);
  }
  double seconds = fastest_s(repeats, [&] {
    auto out = module.execute("forward", inputs);
    if (!out.ok()) runtime_failure(out.error(), "running " + pte);
  });
  return {seconds, flops};
}

}  // namespace

int rates(const std::string& dir, long long repeats, long long pass_elements, long long normal_elements) {
  if (repeats < 1 || pass_elements < 1 || normal_elements < 1)
    fail("--rates needs --repeats, --pass-elements and --normal-elements, each at least 1");
  Matmuls fp32 = time_matmuls(dir + "/fp32.pte", repeats);
  std::string bf16_cost = "null", unmeasured = "{}";
  try {
    Matmuls bf16 = time_matmuls(dir + "/bf16.pte", repeats);
    bf16_cost = json_number(bf16.seconds / fp32.seconds);
  } catch (const Failure& f) {
    unmeasured = "{\"bf16_matmul_cost\": " + json_string(std::string("ExecuTorch cannot run the bf16 matmuls here: ") + f.what()) + "}";
  }
  size_t n = size_t(pass_elements);
  std::vector<float> a(n, 1.0f), b(n, 2.0f), out(n);
  float *pa = a.data(), *pb = b.data(), *po = out.data();
  double pass_s = fastest_s(repeats, [&] { parallel_each(n, [=](size_t k) { po[k] = pa[k] + pb[k]; }); });
  std::vector<float> samples(static_cast<size_t>(normal_elements));
  Normal z{2};
  double normal_s = fastest_s(repeats, [&] { for (auto& v : samples) v = z.next(); });
  if (!std::isfinite(out[n / 2] + samples[samples.size() / 2])) fail("--rates: a non-finite sample");  // keeps both loops
  std::printf("{\"matmul_gflops\": %s, \"bf16_matmul_cost\": %s, \"pass_ns\": %s, \"normal_ns\": %s, "
              "\"source\": \"measured by the native worker (edgebench-worker --rates)\", \"unmeasured\": %s, "
              "\"threads\": %zu}\n",
              json_number(fp32.flops / fp32.seconds / 1e9).c_str(), bf16_cost.c_str(),
              json_number(pass_s / double(pass_elements) * 1e9).c_str(),
              json_number(normal_s / double(normal_elements) * 1e9).c_str(), unmeasured.c_str(),
              size_t(executorch::extension::get_thread_count()));
  return EXIT_OK;
}

}  // namespace edgebench
