#include "common/training/ps_job.h"

#include <nlohmann/json.hpp>

#include "common/messages/fleet_view.h"

namespace tessera {

std::string_view PsModeName(PsConsistency consistency) {
  switch (consistency) {
    case PsConsistency::kSync: return "ps-sync";
    case PsConsistency::kAsync: return "ps-async";
    case PsConsistency::kSsp: return "ps-ssp";
  }
  return "ps-?";
}

StatusOr<PsConsistency> ParsePsMode(std::string_view mode) {
  for (PsConsistency c : {PsConsistency::kSync, PsConsistency::kAsync, PsConsistency::kSsp}) {
    if (mode == PsModeName(c)) return c;
  }
  return InvalidArgumentError("unknown parameter-server mode '" + std::string(mode) +
                              "'; expected ps-sync, ps-async or ps-ssp");
}

std::string EncodePsJobConfig(const PsJobConfig& c) {
  const OptimizerOptions& o = c.optimizer;
  const LrScheduleOptions& s = c.schedule;
  nlohmann::json tables = nlohmann::json::array();
  for (const EmbeddingTableSpec& t : c.tables) {
    tables.push_back({{"name", t.name}, {"rows", t.rows}, {"dim", t.dim},
                      {"init_seed", t.init_seed}});
  }
  nlohmann::json j = {
      {"mode", std::string(PsModeName(c.consistency))},
      {"staleness", c.staleness},
      {"num_workers", c.num_workers},
      {"optimizer",
       {{"kind", std::string(OptimizerKindName(o.kind))}, {"lr", o.lr}, {"momentum", o.momentum},
        {"nesterov", o.nesterov}, {"beta1", o.beta1}, {"beta2", o.beta2}, {"eps", o.eps},
        {"weight_decay", o.weight_decay},
        {"initial_accumulator_value", o.initial_accumulator_value}}},
      {"schedule",
       {{"kind", static_cast<int>(s.kind)}, {"warmup_steps", s.warmup_steps},
        {"step_size", s.step_size}, {"gamma", s.gamma}, {"total_steps", s.total_steps},
        {"min_lr", s.min_lr}}},
      {"dense_elements", c.dense_elements},
      {"layout_fingerprint", c.layout_fingerprint},
      {"chunk_elements", c.chunk_elements},
      {"tables", tables},
  };
  return j.dump();
}

StatusOr<PsJobConfig> DecodePsJobConfig(std::string_view json) {
  PsJobConfig c;
  try {
    nlohmann::json j = nlohmann::json::parse(json);
    ASSIGN_OR_RETURN(c.consistency, ParsePsMode(j.at("mode").get<std::string>()));
    c.staleness = j.at("staleness").get<int64_t>();
    c.num_workers = j.at("num_workers").get<int>();
    const auto& o = j.at("optimizer");
    ASSIGN_OR_RETURN(c.optimizer.kind, ParseOptimizerKind(o.at("kind").get<std::string>()));
    c.optimizer.lr = o.at("lr").get<float>();
    c.optimizer.momentum = o.at("momentum").get<float>();
    c.optimizer.nesterov = o.at("nesterov").get<bool>();
    c.optimizer.beta1 = o.at("beta1").get<float>();
    c.optimizer.beta2 = o.at("beta2").get<float>();
    c.optimizer.eps = o.at("eps").get<float>();
    c.optimizer.weight_decay = o.at("weight_decay").get<float>();
    c.optimizer.initial_accumulator_value = o.at("initial_accumulator_value").get<float>();
    const auto& s = j.at("schedule");
    const int kind = s.at("kind").get<int>();
    if (kind < 0 || kind > static_cast<int>(LrScheduleKind::kCosine)) {
      return InvalidArgumentError("ps job config: schedule kind " + std::to_string(kind));
    }
    c.schedule.kind = static_cast<LrScheduleKind>(kind);
    c.schedule.warmup_steps = s.at("warmup_steps").get<int64_t>();
    c.schedule.step_size = s.at("step_size").get<int64_t>();
    c.schedule.gamma = s.at("gamma").get<float>();
    c.schedule.total_steps = s.at("total_steps").get<int64_t>();
    c.schedule.min_lr = s.at("min_lr").get<float>();
    c.dense_elements = j.at("dense_elements").get<uint64_t>();
    c.layout_fingerprint = j.at("layout_fingerprint").get<uint64_t>();
    c.chunk_elements = j.at("chunk_elements").get<uint64_t>();
    for (const auto& t : j.at("tables")) {
      c.tables.push_back({t.at("name").get<std::string>(), t.at("rows").get<int64_t>(),
                          t.at("dim").get<int64_t>(), t.at("init_seed").get<uint64_t>()});
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("ps job config: ") + e.what());
  }
  RETURN_IF_ERROR(ValidatePsJobConfig(c));
  return c;
}

Status ValidatePsJobConfig(const PsJobConfig& c) {
  if (c.num_workers < 1) {
    return InvalidArgumentError("ps job config: num_workers=" + std::to_string(c.num_workers));
  }
  if (c.staleness < 0) {
    return InvalidArgumentError("--staleness=" + std::to_string(c.staleness) + " is negative");
  }
  if (c.chunk_elements < 1) return InvalidArgumentError("ps job config: chunk_elements is 0");
  for (const EmbeddingTableSpec& t : c.tables) {
    if (t.rows < 1 || t.dim < 1) {
      return InvalidArgumentError("ps job config: embedding table '" + t.name + "' has " +
                                  std::to_string(t.rows) + " rows of " + std::to_string(t.dim));
    }
  }
  RETURN_IF_ERROR(ValidateOptimizerOptions(c.optimizer));
  return ValidateLrSchedule(c.schedule, c.optimizer.lr);
}

uint64_t PsJobToken(const FleetView& view) {
  uint64_t token = 0xcbf29ce484222325ULL;  // FNV-1a
  for (const MemberInfo* worker : view.OfRole(Role::kWorker)) {
    for (uint64_t part : {static_cast<uint64_t>(worker->rank), static_cast<uint64_t>(worker->pid)}) {
      token = (token ^ part) * 0x100000001b3ULL;
    }
  }
  return token;
}

StatusOr<std::vector<DenseChunk>> PlanDenseChunks(uint64_t elements, uint64_t chunk_elements,
                                                  int num_servers, uint64_t key_space) {
  if (num_servers < 1) {
    return InvalidArgumentError("the parameter-server modes need at least one server "
                                "(--servers / --num-servers)");
  }
  if (chunk_elements < 1) return InvalidArgumentError("--ps-chunk-elements must be at least 1");
  std::vector<DenseChunk> chunks;
  const uint64_t count = (elements + chunk_elements - 1) / chunk_elements;
  for (uint64_t c = 0; c < count; ++c) {
    DenseChunk chunk;
    chunk.index = c;
    chunk.offset = c * chunk_elements;
    chunk.size = std::min(chunk_elements, elements - chunk.offset);
    chunk.server = static_cast<int>(c % static_cast<uint64_t>(num_servers));
    auto [begin, end] = ServerKeyRange(key_space, num_servers, chunk.server);
    chunk.key = begin + c / static_cast<uint64_t>(num_servers);
    if (chunk.key >= end) {
      return InvalidArgumentError(
          "server " + std::to_string(chunk.server) + " owns " + std::to_string(end - begin) +
          " keys but needs more for " + std::to_string(count) + " chunks of " +
          std::to_string(chunk_elements) + " floats; raise --ps-chunk-elements or the "
          "coordinator's --key-space");
    }
    chunks.push_back(chunk);
  }
  return chunks;
}

int SparseRowOwner(size_t table, int64_t id, int num_servers) {
  uint64_t x = static_cast<uint64_t>(id) * 0x9e3779b97f4a7c15ULL ^ (table + 1) * 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 29;
  return static_cast<int>(x % static_cast<uint64_t>(num_servers));
}

}  // namespace tessera
