// plan.txt, the native worker's plan (written by edgebench/native/plan.py): a first line naming
// its format, then one `key values...` per line; `input` and `param` repeat, one line each.
// Values are read whole, each where it is used: "abc", "1.5x" or nothing where a number belongs
// is an error naming the file, the line and the key, never a 0 (a `clip` of 0 would turn
// clipping off).
#pragma once

#include <istream>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace edgebench {

// A plan that cannot be read; the message names where and says how to get a good one.
struct PlanError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// `text` read whole as a base-10 whole number: none for "abc", "12x", "1.5", "" or one out of
// range. The plan's values and the worker's arguments are read with it.
std::optional<long long> whole_number(const std::string& text);

inline constexpr const char* kPlanFormat = "edgebench-native-plan 2";

class PlanLine {
 public:
  PlanLine(std::string file, int number, std::string key, std::vector<std::string> values, std::string rest);

  const std::string& key() const { return key_; }
  int number() const { return number_; }  // 1-based, as an editor counts
  size_t size() const { return values_.size(); }
  const std::string& rest() const { return rest_; }  // everything after the key, as written

  const std::string& text(size_t i) const;
  double real(size_t i) const;
  long long integer(size_t i) const;
  long long integer_at_least(size_t i, long long least) const;

  // "FILE:LINE: KEY: what; write the plan again with this edgebench"
  [[noreturn]] void error(const std::string& what) const;

 private:
  std::string file_, key_, rest_;
  int number_;
  std::vector<std::string> values_;
};

class Plan {
 public:
  static Plan read(const std::string& path);
  // `file` names the plan in errors; `dir` is where its batches are.
  static Plan parse(std::istream& in, const std::string& file, const std::string& dir);

  const std::string& dir() const { return dir_; }
  const PlanLine& line(const std::string& key) const;  // the one line of `key`; an error if none
  const PlanLine* find(const std::string& key) const;  // nullptr if none
  std::vector<const PlanLine*> all(const std::string& key) const;

  const std::string& text(const std::string& key, size_t i = 0) const { return line(key).text(i); }
  double real(const std::string& key, size_t i = 0) const { return line(key).real(i); }
  long long integer(const std::string& key, size_t i = 0) const { return line(key).integer(i); }

 private:
  std::string file_, dir_;
  std::vector<PlanLine> lines_;
};

}  // namespace edgebench
