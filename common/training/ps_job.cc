#include "common/training/ps_job.h"

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "common/base/json_number.h"
#include "common/base/quote.h"
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
      {"model", c.model},
  };
  return j.dump();
}

namespace {

// A field of `object` (json_number.h), its errors prefixed as the decoder's others are.
template <typename T>
StatusOr<T> IntegerField(const nlohmann::json& object, const char* name) {
  StatusOr<T> value = JsonInteger<T>(object.at(name), name);
  if (!value.ok()) return value.status().WithContext("ps job config");
  return value;
}

StatusOr<float> FloatField(const nlohmann::json& object, const char* name) {
  StatusOr<float> value = JsonFloat(object.at(name), name);
  if (!value.ok()) return value.status().WithContext("ps job config");
  return value;
}

}  // namespace

StatusOr<PsJobConfig> DecodePsJobConfig(std::string_view json) {
  PsJobConfig c;
  try {
    nlohmann::json j = nlohmann::json::parse(json);
    ASSIGN_OR_RETURN(c.consistency, ParsePsMode(j.at("mode").get<std::string>()));
    ASSIGN_OR_RETURN(c.staleness, IntegerField<int64_t>(j, "staleness"));
    ASSIGN_OR_RETURN(c.num_workers, IntegerField<int>(j, "num_workers"));
    const auto& o = j.at("optimizer");
    ASSIGN_OR_RETURN(c.optimizer.kind, ParseOptimizerKind(o.at("kind").get<std::string>()));
    ASSIGN_OR_RETURN(c.optimizer.lr, FloatField(o, "lr"));
    ASSIGN_OR_RETURN(c.optimizer.momentum, FloatField(o, "momentum"));
    c.optimizer.nesterov = o.at("nesterov").get<bool>();
    ASSIGN_OR_RETURN(c.optimizer.beta1, FloatField(o, "beta1"));
    ASSIGN_OR_RETURN(c.optimizer.beta2, FloatField(o, "beta2"));
    ASSIGN_OR_RETURN(c.optimizer.eps, FloatField(o, "eps"));
    ASSIGN_OR_RETURN(c.optimizer.weight_decay, FloatField(o, "weight_decay"));
    ASSIGN_OR_RETURN(c.optimizer.initial_accumulator_value,
                     FloatField(o, "initial_accumulator_value"));
    const auto& s = j.at("schedule");
    ASSIGN_OR_RETURN(const int kind, IntegerField<int>(s, "kind"));
    if (kind < 0 || kind > static_cast<int>(LrScheduleKind::kCosine)) {
      return InvalidArgumentError("ps job config: schedule kind " + std::to_string(kind));
    }
    c.schedule.kind = static_cast<LrScheduleKind>(kind);
    ASSIGN_OR_RETURN(c.schedule.warmup_steps, IntegerField<int64_t>(s, "warmup_steps"));
    ASSIGN_OR_RETURN(c.schedule.step_size, IntegerField<int64_t>(s, "step_size"));
    ASSIGN_OR_RETURN(c.schedule.gamma, FloatField(s, "gamma"));
    ASSIGN_OR_RETURN(c.schedule.total_steps, IntegerField<int64_t>(s, "total_steps"));
    ASSIGN_OR_RETURN(c.schedule.min_lr, FloatField(s, "min_lr"));
    ASSIGN_OR_RETURN(c.dense_elements, IntegerField<uint64_t>(j, "dense_elements"));
    ASSIGN_OR_RETURN(c.layout_fingerprint, IntegerField<uint64_t>(j, "layout_fingerprint"));
    ASSIGN_OR_RETURN(c.chunk_elements, IntegerField<uint64_t>(j, "chunk_elements"));
    c.model = j.value("model", std::string());
    for (const auto& t : j.at("tables")) {
      EmbeddingTableSpec table;
      table.name = t.at("name").get<std::string>();
      ASSIGN_OR_RETURN(table.rows, IntegerField<int64_t>(t, "rows"));
      ASSIGN_OR_RETURN(table.dim, IntegerField<int64_t>(t, "dim"));
      ASSIGN_OR_RETURN(table.init_seed, IntegerField<uint64_t>(t, "init_seed"));
      c.tables.push_back(std::move(table));
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
  for (size_t t = 0; t < c.tables.size(); ++t) {
    for (size_t u = 0; u < t; ++u) {
      if (c.tables[u].name == c.tables[t].name) {
        return InvalidArgumentError("ps job config: two embedding tables are named '" +
                                    c.tables[t].name + "'");
      }
    }
  }
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
    // A process may run one job after another (a notebook, a benchmark): its endpoint, and so
    // its address, is new for each.
    for (char c : worker->address) token = (token ^ static_cast<uint8_t>(c)) * 0x100000001b3ULL;
  }
  return token;
}

std::vector<uint64_t> PsRegionOffsets(const std::vector<DenseChunk>& chunks, uint64_t* floats) {
  std::vector<size_t> by_index(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) by_index[i] = i;
  std::sort(by_index.begin(), by_index.end(),
            [&chunks](size_t a, size_t b) { return chunks[a].index < chunks[b].index; });
  std::vector<uint64_t> offsets(chunks.size());
  *floats = 0;
  for (size_t i : by_index) {
    offsets[i] = *floats;
    *floats += chunks[i].size;
  }
  return offsets;
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

std::string DescribePsModel(const ParameterLayout& layout,
                            const std::vector<EmbeddingTableSpec>& tables) {
  nlohmann::json params = nlohmann::json::array();
  for (const ParameterView& view : layout.views()) params.push_back({view.name, view.shape});
  nlohmann::json specs = nlohmann::json::array();
  for (const EmbeddingTableSpec& t : tables) specs.push_back({t.name, t.rows, t.dim});
  return nlohmann::json{{"parameters", params}, {"tables", specs}}.dump();
}

namespace {

// "'0.weight' [16, 8]"; for a table "'users' (1000 rows of 16)".
std::string DescribeEntry(const nlohmann::json& entry, bool table) {
  std::string text = Quote(entry.at(0).get<std::string>());
  if (table) {
    return text + " (" + std::to_string(entry.at(1).get<int64_t>()) + " rows of " +
           std::to_string(entry.at(2).get<int64_t>()) + ")";
  }
  text += " [";
  bool first = true;
  for (const auto& d : entry.at(1)) {
    text += (first ? "" : ", ") + std::to_string(d.get<int64_t>());
    first = false;
  }
  return text + "]";
}

}  // namespace

Status CheckPsModel(std::string_view job_model, std::string_view worker_model, int worker_rank) {
  const std::string worker = "worker " + std::to_string(worker_rank);
  try {
    const nlohmann::json job = nlohmann::json::parse(job_model);
    const nlohmann::json mine = nlohmann::json::parse(worker_model);
    for (const char* part : {"parameters", "tables"}) {
      const bool table = std::string_view(part) == "tables";
      const char* noun = table ? "embedding table" : "parameter";
      const auto& expected = job.at(part);
      const auto& got = mine.at(part);
      for (size_t i = 0; i < std::max(expected.size(), got.size()); ++i) {
        const std::string on_worker =
            i < got.size() ? DescribeEntry(got[i], table) : std::string("missing");
        const std::string on_rank0 =
            i < expected.size() ? DescribeEntry(expected[i], table) : std::string("missing");
        if (on_worker == on_rank0) continue;
        return FailedPreconditionError(
            worker + "'s model differs from rank 0's: " + noun + " " + std::to_string(i) + " is " +
            on_worker + " on " + worker + ", " + on_rank0 + " on rank 0 (" +
            std::to_string(got.size()) + " and " + std::to_string(expected.size()) + " " + part +
            "); every worker of a job must build the same model");
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(worker + "'s model description: " + e.what());
  }
  return OkStatus();
}

}  // namespace tessera
