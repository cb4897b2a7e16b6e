#include "plan.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

namespace edgebench {

namespace {

constexpr const char* kFix = "; write the plan again with this edgebench";

std::string quoted(const std::string& text) { return "\"" + text + "\""; }

// `text` read whole as a finite number: none for "abc", "1.5x", "", "nan", "inf" or 1e999.
std::optional<double> finite_number(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v)) return std::nullopt;
  return v;
}

std::string shown(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

const LineRule* rule_of(const std::string& key) {
  for (const LineRule& rule : kPlanValues)
    if (rule.key == key) return &rule;
  return nullptr;  // not checked (`predicted`: JSON, echoed)
}

}  // namespace

PlanLine::PlanLine(std::string file, int number, std::string key, std::vector<std::string> values, std::string rest)
    : file_(std::move(file)), key_(std::move(key)), rest_(std::move(rest)), number_(number), values_(std::move(values)) {}

void PlanLine::error(const std::string& what) const {
  throw PlanError(file_ + ":" + std::to_string(number_) + ": " + key_ + ": " + what + kFix);
}

const std::string& PlanLine::text(size_t i) const {
  if (i >= values_.size()) error("has " + std::to_string(values_.size()) + " values, needs " + std::to_string(i + 1));
  return values_[i];
}

double PlanLine::real(size_t i) const {
  std::string text = i < values_.size() ? values_[i] : "";
  std::optional<double> v = finite_number(text);
  if (!v) error(quoted(text) + " is not a number");
  return *v;
}

std::optional<long long> whole_number(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno == ERANGE) return std::nullopt;
  return v;
}

long long PlanLine::integer(size_t i) const {
  std::string text = i < values_.size() ? values_[i] : "";
  std::optional<long long> v = whole_number(text);
  if (!v) error(quoted(text) + " is not a whole number");
  return *v;
}

void PlanLine::check(const LineRule& rule) const {
  size_t n = rule.values.size();
  if (values_.size() < n || (values_.size() > n && !rule.repeats))
    error("has " + std::to_string(values_.size()) + " values, needs " + std::to_string(n) + (rule.repeats ? " or more" : ""));
  for (size_t i = 0; i < values_.size(); ++i) {
    const ValueRule& r = rule.values[std::min(i, n - 1)];
    const std::string& v = values_[i];
    if (r.kind == ValueRule::kWhole) {
      std::optional<long long> x = whole_number(v);
      if (!x || *x < r.least || *x > r.most)
        error(quoted(v) + " is not a whole number in " + std::to_string(r.least) + ".." + std::to_string(r.most));
    } else if (r.kind == ValueRule::kReal) {
      std::optional<double> x = finite_number(v);
      if (!x || *x < r.low || (r.above && *x == r.low) || *x > r.high)
        error(quoted(v) + " is not a number in " + (r.above ? "(" : "[") + shown(r.low) + ", " + shown(r.high) +
              (std::isinf(r.high) ? ")" : "]"));
    } else if ((r.kind == ValueRule::kName || r.kind == ValueRule::kNameEnd) &&
               (v.find('/') != std::string::npos || (r.kind == ValueRule::kName && v[0] == '.'))) {
      error(quoted(rest_) + " would name a file outside its folder (a file name has no '/' and does not start with '.')");
    }
  }
}

Plan Plan::read(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw PlanError(path + ": cannot read the native plan (" + std::strerror(errno) + "); deploy or bench writes it");
  auto slash = path.rfind('/');
  return parse(in, path, slash == std::string::npos ? "." : path.substr(0, slash));
}

Plan Plan::parse(std::istream& in, const std::string& file, const std::string& dir) {
  Plan plan;
  plan.file_ = file;
  plan.dir_ = dir;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    if (++number == 1) {
      if (line != kPlanFormat)
        throw PlanError(file + ": not a native plan of this worker's format (first line '" + line +
                        "'); rebuild the worker and plan with the same edgebench");
      continue;
    }
    std::istringstream words(line);
    std::string key, word;
    if (!(words >> key)) continue;  // a blank line
    std::vector<std::string> values;
    while (words >> word) values.push_back(word);
    auto start = line.find_first_not_of(" \t", line.find(key) + key.size());
    plan.lines_.emplace_back(file, number, key, std::move(values), start == std::string::npos ? "" : line.substr(start));
    if (const LineRule* rule = rule_of(key)) plan.lines_.back().check(*rule);
  }
  if (number == 0) throw PlanError(file + ": empty" + kFix);
  return plan;
}

const PlanLine* Plan::find(const std::string& key) const {
  for (const auto& l : lines_)
    if (l.key() == key) return &l;
  return nullptr;
}

const PlanLine& Plan::line(const std::string& key) const {
  const PlanLine* found = find(key);
  if (!found) throw PlanError(file_ + ": no `" + key + "` line" + kFix);
  return *found;
}

std::vector<const PlanLine*> Plan::all(const std::string& key) const {
  std::vector<const PlanLine*> out;
  for (const auto& l : lines_)
    if (l.key() == key) out.push_back(&l);
  return out;
}

}  // namespace edgebench
