#include "common/messages/membership.h"

#include <nlohmann/json.hpp>

#include <cstdio>

#include "common/base/quote.h"

namespace tessera {

const char* MembershipKindName(MembershipKind kind) {
  switch (kind) {
    case MembershipKind::kJoin:
      return "join";
    case MembershipKind::kExit:
      return "exit";
    case MembershipKind::kKilled:
      return "killed";
    case MembershipKind::kError:
      return "error";
  }
  return "unknown";
}

StatusOr<MembershipKind> ParseMembershipKind(const std::string& name) {
  for (MembershipKind kind : {MembershipKind::kJoin, MembershipKind::kExit,
                              MembershipKind::kKilled, MembershipKind::kError}) {
    if (name == MembershipKindName(kind)) return kind;
  }
  return InvalidArgumentError("membership kind " + Quote(name) +
                              " is not one of join, exit, killed, error");
}

std::string MembershipJsonLine(const MembershipChange& change) {
  nlohmann::json line;
  line["epoch"] = change.epoch;
  line["step"] = change.step;
  line["kind"] = MembershipKindName(change.kind);
  line["rank"] = change.rank;
  line["reason"] = change.reason;
  line["world_size"] = change.world_size;
  line["time"] = change.unix_time_s;
  // Invalid UTF-8 in a reason (an error's bytes) is replaced, not thrown.
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

StatusOr<MembershipChange> ParseMembershipJsonLine(const std::string& line) {
  nlohmann::json json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) {
    return InvalidArgumentError("membership log line " + Quote(line) + " is not a JSON object");
  }
  auto field = [&](const char* name, bool number) -> Status {
    auto it = json.find(name);
    if (it == json.end() || (number ? !it->is_number() : !it->is_string())) {
      return InvalidArgumentError("membership log line " + Quote(line) + ": field \"" + name +
                                  "\" is missing or not a " + (number ? "number" : "string"));
    }
    return OkStatus();
  };
  for (const char* name : {"epoch", "step", "rank", "world_size", "time"}) {
    RETURN_IF_ERROR(field(name, true));
  }
  RETURN_IF_ERROR(field("kind", false));
  RETURN_IF_ERROR(field("reason", false));
  MembershipChange change;
  change.epoch = json["epoch"].get<uint64_t>();
  change.step = json["step"].get<int64_t>();
  ASSIGN_OR_RETURN(change.kind, ParseMembershipKind(json["kind"].get<std::string>()));
  change.rank = json["rank"].get<int>();
  change.reason = json["reason"].get<std::string>();
  change.world_size = json["world_size"].get<int>();
  change.unix_time_s = json["time"].get<double>();
  return change;
}

std::string DescribeMembershipChange(const MembershipChange& change) {
  std::string text = "membership epoch " + std::to_string(change.epoch) + ": worker " +
                     std::to_string(change.rank);
  if (change.kind == MembershipKind::kJoin) {
    text += " joined after step " + std::to_string(change.step);
  } else {
    text += " left after step " + std::to_string(change.step) + " (" +
            MembershipKindName(change.kind) + (change.reason.empty() ? "" : ": " + change.reason) +
            ")";
  }
  return text + "; " + std::to_string(change.world_size) +
         (change.world_size == 1 ? " worker now" : " workers now");
}

MembershipHistory::MembershipHistory(int min_workers, int max_workers, int initial_workers)
    : min_workers_(min_workers), max_workers_(max_workers) {
  for (int rank = 0; rank < initial_workers; ++rank) in_job_.insert(rank);
}

StatusOr<MembershipChange> MembershipHistory::Leave(int rank, MembershipKind kind,
                                                    const std::string& reason, int64_t step,
                                                    double unix_time_s) {
  if (in_job_.erase(rank) == 0) {
    return FailedPreconditionError("worker " + std::to_string(rank) +
                                   " cannot leave: it is not in the job (membership epoch " +
                                   std::to_string(epoch()) + ")");
  }
  if (kind == MembershipKind::kExit) ++exited_;
  changes_.push_back({epoch() + 1, step, kind, rank, reason, world_size(), unix_time_s});
  return changes_.back();
}

StatusOr<MembershipChange> MembershipHistory::Join(int rank, int64_t step, double unix_time_s) {
  if (world_size() >= max_workers_) {
    return ResourceExhaustedError("join refused: the job has " + std::to_string(world_size()) +
                                  " workers, --max-workers " + std::to_string(max_workers_));
  }
  if (rank < 0 || rank >= max_workers_ || in_job_.count(rank) > 0) {
    return FailedPreconditionError("worker " + std::to_string(rank) +
                                   " cannot join: that rank is in the job or not below "
                                   "--max-workers " + std::to_string(max_workers_));
  }
  in_job_.insert(rank);
  changes_.push_back({epoch() + 1, step, MembershipKind::kJoin, rank, "join", world_size(),
                      unix_time_s});
  return changes_.back();
}

int MembershipHistory::FreeRank() const {
  for (int rank = 0; rank < max_workers_; ++rank) {
    if (in_job_.count(rank) == 0) return rank;
  }
  return -1;
}

std::string MembershipHistory::StopReason(const MembershipChange& cause,
                                          const std::string& checkpoint) const {
  const int w = world_size();
  return "the job has " + std::to_string(w) + (w == 1 ? " worker" : " workers") +
         ", below --min-workers " + std::to_string(min_workers_) + ", since " +
         DescribeMembershipChange(cause) +
         (checkpoint.empty() ? "" : "; last checkpoint: " + checkpoint);
}

}  // namespace tessera
