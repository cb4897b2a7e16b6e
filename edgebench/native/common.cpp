#include "common.h"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>

namespace edgebench {

using executorch::runtime::Error;

namespace {

volatile std::sig_atomic_t g_signal = 0;

}  // namespace

void fail(const std::string& what) { throw Failure(EXIT_ERROR, "error", what); }

bool LossWatch::diverged(double loss) {
  if (!std::isfinite(loss)) return true;
  if (!first_) first_ = loss;
  recent_.push_back(loss);
  if (recent_.size() > DIVERGED_WINDOW) recent_.pop_front();
  double sum = 0;
  for (double l : recent_) sum += l;
  return sum / double(recent_.size()) > DIVERGED_FACTOR * *first_;
}

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + "\"";
}

std::string json_detail(const std::string& s) {
  if (s.size() <= MAX_DETAIL_CHARS) return json_string(s);
  size_t cut = MAX_DETAIL_CHARS;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  return json_string(s.substr(0, cut));
}

std::string json_number(double v) {
  if (std::isnan(v)) return "NaN";  // what Python's json writes (and reads back)
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

Events::Events(const std::string& path) : fh_(std::fopen(path.c_str(), "a")) {
  if (!fh_) throw Failure(errno == ENOSPC ? EXIT_NO_SPACE : EXIT_ERROR, "", "cannot open " + path + ": " + std::strerror(errno));
}

Events::~Events() {
  if (fh_) std::fclose(fh_);
}

void Events::write(const std::string& event, const std::string& fields, int64_t t_ns) {
  std::string line = "{\"t_ns\": " + std::to_string(t_ns) + ", \"event\": " + json_string(event) +
                     (fields.empty() ? "" : ", " + fields) + "}\n";
  if (std::fputs(line.c_str(), fh_) < 0 || std::fflush(fh_) != 0) {
    int err = errno;
    throw Failure(err == ENOSPC ? EXIT_NO_SPACE : EXIT_ERROR, "", std::string("cannot write events.jsonl: ") + std::strerror(err));
  }
}

std::string error_text(Error e) {
  switch (e) {
    case Error::InvalidArgument: return "InvalidArgument";
    case Error::InvalidProgram: return "InvalidProgram";
    case Error::InvalidState: return "InvalidState";
    case Error::NotFound: return "NotFound";
    case Error::NotSupported: return "NotSupported";
    case Error::NotImplemented: return "NotImplemented";
    case Error::OperatorMissing: return "OperatorMissing";
    case Error::MemoryAllocationFailed: return "MemoryAllocationFailed";
    case Error::AccessFailed: return "AccessFailed";
    default: return "error " + std::to_string(int(e));
  }
}

void runtime_failure(Error e, const std::string& where) {
  if (e == Error::MemoryAllocationFailed) throw Failure(EXIT_OOM, "oom", where + ": ExecuTorch could not allocate memory");
  fail(where + ": ExecuTorch " + error_text(e));
}

void on_signal(int signum) { g_signal = signum; }

void check_signal() {
  if (g_signal) {
    const char* name = g_signal == SIGINT ? "Ctrl-C (SIGINT)" : "SIGTERM";
    throw Failure(EXIT_INTERRUPTED, "interrupted", std::string("stopped by ") + name);
  }
}

}  // namespace edgebench
