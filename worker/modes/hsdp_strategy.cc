#include "worker/modes/hsdp_strategy.h"

#include <map>
#include <utility>

#include "common/base/logging.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/ring_channel_setup.h"
#include "worker/engines/zero_engine.h"
#include "worker/modes/group_tags.h"
#include "worker/modes/ring_strategy.h"

namespace tessera::worker {
namespace {

// The world's Splits into the shard and the replicate groups: tags of their own (the engines
// use 1 << 40 .. 1 << 44 and 1 << 59 up).
constexpr uint64_t kShardSplitTag = 1ull << 57;
constexpr uint64_t kReplicateSplitTag = kShardSplitTag + 1;

}  // namespace

StatusOr<std::vector<int>> ShardGroupOfRanks(const std::vector<std::string>& peer_addresses,
                                             int shard_group_size) {
  const int world = static_cast<int>(peer_addresses.size());
  std::vector<int> group_of(peer_addresses.size());
  if (shard_group_size > 0) {
    if (world % shard_group_size != 0) {
      return InvalidArgumentError("--shard-group-size " + std::to_string(shard_group_size) +
                                  " does not divide the world of " + std::to_string(world) +
                                  " workers");
    }
    for (int r = 0; r < world; ++r) group_of[static_cast<size_t>(r)] = r / shard_group_size;
    return group_of;
  }
  // By host, in the order of each host's lowest rank (as RingOrder orders them).
  std::map<std::string, int> host_groups;
  std::vector<int> sizes;
  for (int r = 0; r < world; ++r) {
    const std::string host = PeerHost(peer_addresses[static_cast<size_t>(r)]);
    auto [at, added] = host_groups.emplace(host, static_cast<int>(sizes.size()));
    if (added) sizes.push_back(0);
    ++sizes[static_cast<size_t>(at->second)];
    group_of[static_cast<size_t>(r)] = at->second;
  }
  for (const auto& [host, group] : host_groups) {
    if (sizes[static_cast<size_t>(group)] != sizes[0]) {
      return InvalidArgumentError(
          "hsdp shards within each host, but host " + host + " has " +
          std::to_string(sizes[static_cast<size_t>(group)]) + " workers and the first has " +
          std::to_string(sizes[0]) + ": pass --shard-group-size");
    }
  }
  return group_of;
}

StatusOr<std::unique_ptr<TrainingStrategy>> MakeHsdpStrategy(const StrategyContext& context) {
  ASSIGN_OR_RETURN(std::vector<std::string> peers,
                   RingPeerAddresses(context.mode.client->view()));
  ASSIGN_OR_RETURN(std::vector<int> group_of,
                   ShardGroupOfRanks(peers, context.mode.flags->shard_group_size));
  return MakeGroupedRingStrategy(
      context,
      [&context, group_of](Communicator* world, std::vector<std::unique_ptr<Collectives>>* groups)
          -> StatusOr<std::unique_ptr<TrainingEngine>> {
        const int rank = world->rank();
        ASSIGN_OR_RETURN(std::unique_ptr<Communicator> shard,
                         world->Split(group_of[static_cast<size_t>(rank)], kShardSplitTag));
        const int index = shard->rank();
        ASSIGN_OR_RETURN(std::unique_ptr<Communicator> replicate,
                         world->Split(index, kReplicateSplitTag));
        TLOG(INFO) << "hsdp: shard " << shard->name() << " (ring channel: "
                   << shard->channel_description() << "), replicate " << replicate->name();
        auto shard_tags = std::make_unique<GroupTags>(std::move(shard));
        auto replicate_tags = std::make_unique<GroupTags>(std::move(replicate));
        ZeroEngineOptions options;
        options.stage = 3;
        options.optimizer = context.optimizer;
        options.schedule = context.schedule;
        options.prefetch = !context.mode.flags->no_overlap;
        options.comm_spin_us = context.mode.flags->comm_spin_us;
        // A wait covers one block's collectives, each bounded by the request timeout; here
        // a reduce-scatter and an all-reduce per tensor.
        options.wait_timeout_ms = 8 * context.mode.runtime->config().request_timeout_ms;
        options.replicate = replicate_tags.get();
        options.first_replica = group_of[static_cast<size_t>(rank)] == 0;
        options.restores_checkpoints_of = context.restores_checkpoints_of;
        ASSIGN_OR_RETURN(std::unique_ptr<ZeroEngine> engine,
                         ZeroEngine::Create(options, shard_tags.get(),
                                            &context.mode.runtime->metrics()));
        groups->push_back(std::move(shard_tags));
        groups->push_back(std::move(replicate_tags));
        return std::unique_ptr<TrainingEngine>(std::move(engine));
      });
}

}  // namespace tessera::worker
