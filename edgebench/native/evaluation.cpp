#include "evaluation.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

namespace edgebench {

namespace {

std::string header_of(const std::vector<Param>& params) {
  std::string json = "{";
  size_t offset = 0;
  for (const Param& p : params) {
    std::string shape;
    for (int64_t size : p.shape) shape += (shape.empty() ? "" : ",") + std::to_string(size);
    if (p.shape.empty()) shape = std::to_string(p.numel);
    size_t end = offset + p.numel * p.element_bytes;
    json += (json.size() > 1 ? "," : "") + json_string(p.name) + ":{\"dtype\":\"" + p.dtype + "\",\"shape\":[" + shape +
            "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  json += "}";
  json.append((8 - json.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as safetensors writes it
  return json;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<Param>& params) {
  std::string header = header_of(params);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = (unsigned char)(uint64_t(header.size()) >> (8 * i));
  std::string partial = path + ".partial";
  std::FILE* fh = std::fopen(partial.c_str(), "wb");
  if (!fh) throw std::runtime_error("cannot write " + partial + ": " + std::strerror(errno));
  bool ok = std::fwrite(length, 1, 8, fh) == 8 && std::fwrite(header.data(), 1, header.size(), fh) == header.size();
  for (const Param& p : params)  // as the host holds it: this worker runs on little-endian CPUs only
    ok = ok && std::fwrite(p.data, p.element_bytes, p.numel, fh) == p.numel;
  ok = ok && std::fflush(fh) == 0 && fsync(fileno(fh)) == 0;
  int err = errno;
  ok = std::fclose(fh) == 0 && ok;
  if (ok && std::rename(partial.c_str(), path.c_str()) == 0) return;
  err = ok ? errno : err;
  std::remove(partial.c_str());  // no partial file is left to look saved
  throw std::runtime_error("cannot write " + path + ": " + std::strerror(err));
}

Evaluation::Evaluation(const Plan& plan, std::string out_dir) : out_dir_(std::move(out_dir)) {
  every_ = plan.integer("eval_every");
  const PlanLine& name = plan.line("eval_weights");
  prefix_ = name.text(0);
  width_ = name.integer(1);
  suffix_ = name.text(2);
}

std::string Evaluation::file(long long steps) const {
  std::string number = std::to_string(steps);
  if (number.size() < size_t(width_)) number.insert(0, size_t(width_) - number.size(), '0');
  return prefix_ + number + suffix_;
}

void Evaluation::run(long long steps, const std::vector<Param>& params, Events& events) {
  last_ = steps;
  int64_t begin = now_ns();
  std::string after = "\"after_steps\": " + std::to_string(steps);
  try {
    if (steps > 0) write_safetensors(out_dir_ + "/" + file(steps), params);
  } catch (const std::runtime_error& e) {  // the training figures stand without it
    every_ = 0;
    events.write("eval_failed", after + ", \"detail\": " + json_detail(e.what()), begin);
    return;
  }
  events.write("eval_weights", "\"end_ns\": " + std::to_string(now_ns()) + ", " + after, begin);
}

}  // namespace edgebench
