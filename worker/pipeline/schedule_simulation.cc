#include "worker/pipeline/schedule_simulation.h"

#include <algorithm>
#include <string>

namespace tessera::worker {
namespace {

constexpr int kOps = 8;

class Simulation {
 public:
  Simulation(const std::vector<std::vector<PipelineAction>>& actions, int stages,
             int micro_batches, const ScheduleCosts& costs)
      : actions_(actions),
        ranks_(static_cast<int>(actions.size())),
        stages_(stages),
        micro_batches_(micro_batches),
        costs_(costs),
        count_(Slots(), 0),
        position_(Slots(), -1),
        done_(Slots(), -1) {}

  // Every action in range, on its rank, once; every forward and backward there, every message
  // where it belongs; nothing before what it needs on its own rank.
  Status Check() {
    if (ranks_ < 1 || stages_ < ranks_ || stages_ % ranks_ != 0 || micro_batches_ < 1) {
      return InvalidArgumentError("a schedule of " + std::to_string(stages_) + " stages over " +
                                  std::to_string(ranks_) + " ranks and " +
                                  std::to_string(micro_batches_) + " micro-batches");
    }
    for (int r = 0; r < ranks_; ++r) {
      const auto& list = actions_[static_cast<size_t>(r)];
      for (size_t i = 0; i < list.size(); ++i) {
        const PipelineAction& a = list[i];
        if (a.stage < 0 || a.stage >= stages_ || a.micro_batch < 0 ||
            a.micro_batch >= micro_batches_ || static_cast<int>(a.op) >= kOps) {
          return Bad(r, a, "is out of range");
        }
        if (RankOf(a.stage) != r) {
          return Bad(r, a, "belongs on rank " + std::to_string(RankOf(a.stage)));
        }
        const size_t key = Key(a);
        if (++count_[key] > 1) return Bad(r, a, "is listed twice");
        position_[key] = static_cast<int>(i);
      }
    }
    for (int s = 0; s < stages_; ++s) {
      for (int m = 0; m < micro_batches_; ++m) {
        RETURN_IF_ERROR(Expect({PipelineOp::kForward, s, m}, true));
        const PipelineAction input{PipelineOp::kBackwardInput, s, m};
        const PipelineAction weight{PipelineOp::kBackwardWeight, s, m};
        const bool whole = Count({PipelineOp::kBackward, s, m}) > 0;
        if (!whole && Count(input) == 0 && Count(weight) == 0) {
          return InvalidArgumentError("rank " + std::to_string(RankOf(s)) + " never runs " +
                                      ActionName({PipelineOp::kBackward, s, m}) + " (nor " +
                                      ActionName(input) + " and " + ActionName(weight) + ")");
        }
        RETURN_IF_ERROR(Expect({PipelineOp::kBackward, s, m}, whole));
        RETURN_IF_ERROR(Expect({PipelineOp::kBackwardInput, s, m}, !whole));
        RETURN_IF_ERROR(Expect({PipelineOp::kBackwardWeight, s, m}, !whole));
        const bool from_before = s > 0 && RankOf(s - 1) != RankOf(s);
        const bool to_after = s + 1 < stages_ && RankOf(s + 1) != RankOf(s);
        RETURN_IF_ERROR(Expect({PipelineOp::kRecvActivation, s, m}, from_before));
        RETURN_IF_ERROR(Expect({PipelineOp::kSendGradient, s, m}, from_before));
        RETURN_IF_ERROR(Expect({PipelineOp::kSendActivation, s, m}, to_after));
        RETURN_IF_ERROR(Expect({PipelineOp::kRecvGradient, s, m}, to_after));
      }
    }
    for (int r = 0; r < ranks_; ++r) {
      for (const PipelineAction& a : actions_[static_cast<size_t>(r)]) {
        for (const PipelineAction& need : Needs(a)) {
          if (RankOf(need.stage) == r && position_[Key(need)] > position_[Key(a)]) {
            return Bad(r, a, "comes before " + ActionName(need) + ", which it needs");
          }
        }
      }
    }
    return OkStatus();
  }

  StatusOr<SimulatedSchedule> Run() {
    std::vector<size_t> next(static_cast<size_t>(ranks_), 0);
    std::vector<double> clock(static_cast<size_t>(ranks_), 0);
    std::vector<int> held(static_cast<size_t>(ranks_), 0);
    SimulatedSchedule run;
    run.busy.assign(static_cast<size_t>(ranks_), 0);
    run.peak_held.assign(static_cast<size_t>(ranks_), 0);
    while (true) {
      bool progress = false, finished = true;
      for (int r = 0; r < ranks_; ++r) {
        const size_t i = static_cast<size_t>(r);
        const auto& list = actions_[i];
        while (next[i] < list.size()) {
          const PipelineAction& a = list[next[i]];
          double start = clock[i];
          bool ready = true;
          for (const PipelineAction& need : Needs(a)) {
            const double at = done_[Key(need)];
            if (at < 0) {
              ready = false;
              break;
            }
            start = std::max(start, at);
          }
          if (!ready) break;
          const double cost = Cost(a.op);
          clock[i] = start + cost;
          done_[Key(a)] = clock[i];
          run.busy[i] += cost;
          if (a.op == PipelineOp::kForward) ++held[i];
          if (a.op == PipelineOp::kBackward || a.op == PipelineOp::kBackwardWeight) --held[i];
          run.peak_held[i] = std::max(run.peak_held[i], held[i]);
          ++next[i];
          progress = true;
        }
        if (next[i] < list.size()) finished = false;
      }
      if (finished) break;
      if (!progress) return Deadlock(next);
    }
    run.makespan = *std::max_element(clock.begin(), clock.end());
    double busy = 0;
    for (double b : run.busy) busy += b;
    run.bubble_fraction = run.makespan > 0 ? 1 - busy / (ranks_ * run.makespan) : 0;
    return run;
  }

 private:
  size_t Slots() const {
    return static_cast<size_t>(kOps) * static_cast<size_t>(std::max(stages_, 0)) *
           static_cast<size_t>(std::max(micro_batches_, 0));
  }
  size_t Key(const PipelineAction& a) const {
    return (static_cast<size_t>(a.op) * static_cast<size_t>(stages_) +
            static_cast<size_t>(a.stage)) *
               static_cast<size_t>(micro_batches_) +
           static_cast<size_t>(a.micro_batch);
  }
  int RankOf(int stage) const { return stage % ranks_; }
  int Count(const PipelineAction& a) const { return count_[Key(a)]; }

  double Cost(PipelineOp op) const {
    switch (op) {
      case PipelineOp::kForward: return costs_.forward;
      case PipelineOp::kBackward: return costs_.backward_input + costs_.backward_weight;
      case PipelineOp::kBackwardInput: return costs_.backward_input;
      case PipelineOp::kBackwardWeight: return costs_.backward_weight;
      default: return 0;  // messages
    }
  }

  // The action that computes stage s's input gradient for micro-batch m: B or I.
  PipelineAction InputGradient(int s, int m) const {
    const PipelineAction whole{PipelineOp::kBackward, s, m};
    return Count(whole) > 0 ? whole : PipelineAction{PipelineOp::kBackwardInput, s, m};
  }

  // What must be done before `a` may start.
  std::vector<PipelineAction> Needs(const PipelineAction& a) const {
    const int s = a.stage, m = a.micro_batch;
    switch (a.op) {
      case PipelineOp::kForward:
        if (s == 0) return {};
        if (RankOf(s - 1) == RankOf(s)) return {{PipelineOp::kForward, s - 1, m}};
        return {{PipelineOp::kRecvActivation, s, m}};
      case PipelineOp::kBackward:
      case PipelineOp::kBackwardInput:
        if (s + 1 == stages_) return {{PipelineOp::kForward, s, m}};
        if (RankOf(s + 1) == RankOf(s)) {
          return {{PipelineOp::kForward, s, m}, InputGradient(s + 1, m)};
        }
        return {{PipelineOp::kForward, s, m}, {PipelineOp::kRecvGradient, s, m}};
      case PipelineOp::kBackwardWeight:
        return {{PipelineOp::kBackwardInput, s, m}};
      case PipelineOp::kRecvActivation:
        return {{PipelineOp::kSendActivation, s - 1, m}};
      case PipelineOp::kSendActivation:
        return {{PipelineOp::kForward, s, m}};
      case PipelineOp::kRecvGradient:
        return {{PipelineOp::kSendGradient, s + 1, m}};
      case PipelineOp::kSendGradient:
        return {InputGradient(s, m)};
    }
    return {};
  }

  Status Expect(const PipelineAction& a, bool wanted) const {
    const int count = Count(a);
    if (wanted && count == 0) {
      return InvalidArgumentError("rank " + std::to_string(RankOf(a.stage)) + " never runs " +
                                  ActionName(a));
    }
    if (!wanted && count > 0) {
      return Bad(RankOf(a.stage), a, "does not belong in this schedule");
    }
    return OkStatus();
  }

  static Status Bad(int rank, const PipelineAction& a, const std::string& why) {
    return InvalidArgumentError("rank " + std::to_string(rank) + "'s " + ActionName(a) + " " +
                                why);
  }

  Status Deadlock(const std::vector<size_t>& next) const {
    std::string waits;
    for (int r = 0; r < ranks_; ++r) {
      const auto& list = actions_[static_cast<size_t>(r)];
      const size_t i = next[static_cast<size_t>(r)];
      if (i >= list.size()) continue;
      std::string what;
      for (const PipelineAction& need : Needs(list[i])) {
        if (done_[Key(need)] < 0) {
          what = ActionName(need) + " (rank " + std::to_string(RankOf(need.stage)) + ")";
          break;
        }
      }
      waits += (waits.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
               " waits at " + ActionName(list[i]) + " for " + what;
    }
    return FailedPreconditionError("deadlock: " + waits);
  }

  const std::vector<std::vector<PipelineAction>>& actions_;
  const int ranks_;
  const int stages_;
  const int micro_batches_;
  const ScheduleCosts costs_;
  std::vector<int> count_;     // by Key: how often listed
  std::vector<int> position_;  // by Key: where on its rank's list
  std::vector<double> done_;   // by Key: when it finished; -1 not yet
};

}  // namespace

StatusOr<SimulatedSchedule> SimulateSchedule(
    const std::vector<std::vector<PipelineAction>>& actions, int stages, int micro_batches,
    const ScheduleCosts& costs) {
  if (actions.empty() || stages < 1 || micro_batches < 1) {
    return InvalidArgumentError("a schedule of " + std::to_string(actions.size()) +
                                " ranks, " + std::to_string(stages) + " stages and " +
                                std::to_string(micro_batches) + " micro-batches");
  }
  Simulation simulation(actions, stages, micro_batches, costs);
  RETURN_IF_ERROR(simulation.Check());
  return simulation.Run();
}

}  // namespace tessera::worker
