// Timeline: child processes of one benchmark measurement, with the time each of their lines
// and exits was seen (tools/process_group.h underneath).
#ifndef TESSERA_TOOLS_BENCH_CHILD_TIMELINE_H_
#define TESSERA_TOOLS_BENCH_CHILD_TIMELINE_H_

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/base/deadline.h"
#include "common/base/status.h"
#include "tools/bench/bench_util.h"
#include "tools/process_group.h"

namespace tessera::tools {

// Children of one measurement, with the time each line and exit was seen. Polls continuously,
// so those times are within a poll of the events.
class Timeline {
 public:
  explicit Timeline(int64_t timeout_ms) : deadline_(Deadline::AfterMillis(timeout_ms)) {}
  ~Timeline() { group_.StopAll(std::chrono::milliseconds(2000), [](const ChildEvent&) {}); }

  StatusOr<int> Spawn(const std::string& label, const std::vector<std::string>& argv) {
    started_[static_cast<int>(group_.size())] = Clock::now();
    return group_.Spawn(label, argv);
  }
  Status Signal(int child, int signal) { return group_.Signal(child, signal); }
  Clock::time_point started(int child) const { return started_.at(child); }

  struct Line {
    std::string text;
    Clock::time_point when;
  };

  // Polls until `child` printed a line containing `text`; returns it and when it was seen.
  StatusOr<Line> WaitForLine(int child, const std::string& text) {
    while (true) {
      for (const Line& line : lines_[child]) {
        if (line.text.find(text) != std::string::npos) return line;
      }
      if (exits_.count(child) != 0) {
        return FailedPreconditionError(group_.Label(child) + " exited without printing '" +
                                       text + "'" + Tail(child));
      }
      RETURN_IF_ERROR(PollOnce("'" + text + "' from " + group_.Label(child)));
    }
  }

  // Polls until `child` printed a line containing `text` as its line `from` or later; returns
  // its index and the line.
  StatusOr<std::pair<size_t, Line>> WaitForLineFrom(int child, const std::string& text,
                                                    size_t from) {
    while (true) {
      const std::vector<Line>& lines = lines_[child];
      for (size_t i = from; i < lines.size(); ++i) {
        if (lines[i].text.find(text) != std::string::npos) return std::make_pair(i, lines[i]);
      }
      from = std::max(from, lines.size());
      if (exits_.count(child) != 0) {
        return FailedPreconditionError(group_.Label(child) + " exited without printing '" +
                                       text + "'" + Tail(child));
      }
      RETURN_IF_ERROR(PollOnce("'" + text + "' from " + group_.Label(child)));
    }
  }
  // How many lines `child` printed so far.
  size_t LineCount(int child) { return lines_[child].size(); }

  // Polls until `child` exited with status 0; returns when it was reaped.
  StatusOr<Clock::time_point> WaitForExit(int child) {
    while (exits_.count(child) == 0) {
      RETURN_IF_ERROR(PollOnce("the exit of " + group_.Label(child)));
    }
    const auto& [exit, when] = exits_.at(child);
    if (!exit.success()) {
      return InternalError(group_.Label(child) + " " + exit.Describe() + Tail(child));
    }
    return when;
  }

 private:
  Status PollOnce(const std::string& waiting_for) {
    if (deadline_.Expired()) return DeadlineExceededError("waiting for " + waiting_for);
    for (const ChildEvent& event : group_.Poll(Deadline::AfterMillis(50))) {
      const Clock::time_point now = Clock::now();
      if (event.kind == ChildEvent::Kind::kExit) {
        exits_.emplace(event.child, std::make_pair(event.exit, now));
      } else {
        lines_[event.child].push_back(Line{event.line, now});
      }
    }
    return OkStatus();
  }

  std::string Tail(int child) const {
    auto it = lines_.find(child);
    if (it == lines_.end()) return "";
    std::string tail;
    const auto& lines = it->second;
    for (size_t i = lines.size() > 5 ? lines.size() - 5 : 0; i < lines.size(); ++i) {
      tail += "\n  " + lines[i].text;
    }
    return tail;
  }

  Deadline deadline_;
  ProcessGroup group_;
  std::map<int, Clock::time_point> started_;
  std::map<int, std::vector<Line>> lines_;
  std::map<int, std::pair<ChildExit, Clock::time_point>> exits_;
};

}  // namespace tessera::tools

#endif  // TESSERA_TOOLS_BENCH_CHILD_TIMELINE_H_
