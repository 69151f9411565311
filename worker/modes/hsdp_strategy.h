// --mode hsdp (issue 44, item 4; PyTorch FSDP's HYBRID_SHARD): ZeRO-3 within each shard group,
// replicated across the groups. The shard groups are the ranks of each host (by the host of
// each worker's transport address), or with --shard-group-size N the consecutive ranks
// 0..N-1, N..2N-1, ...; the replicate groups are the ranks with the same index in their shard
// group. The ZeRO engine (worker/engines/zero_engine.h, its HSDP paragraph) runs stage 3 on
// the shard group and averages each gradient shard across the replicate group, so the
// parameters equal --mode zero3 and allreduce on the same world up to float rounding.
//
// Checkpoints: zero3's sharded ones (worker/engines/sharded_state.h), written by the first
// shard group, restorable at any world size in any sharded mode.
//
// Errors: a --shard-group-size that does not divide the world, or hosts with different
// numbers of workers, name the numbers.
#ifndef TESSERA_WORKER_MODES_HSDP_STRATEGY_H_
#define TESSERA_WORKER_MODES_HSDP_STRATEGY_H_

#include <memory>
#include <string>
#include <vector>

#include "common/base/status.h"
#include "worker/modes/training_strategy.h"

namespace tessera::worker {

// The shard group (its color: 0, 1, ... in the order of the groups' lowest ranks) of each
// rank: consecutive groups of `shard_group_size`, or with 0 the ranks of each host of
// `peer_addresses` (one per rank). InvalidArgument when the groups would differ in size.
StatusOr<std::vector<int>> ShardGroupOfRanks(const std::vector<std::string>& peer_addresses,
                                             int shard_group_size);

// --shard-group-size, --no-overlap (no prefetch) and the ring's flags. REQUIRES:
// context.mode.client is not null.
StatusOr<std::unique_ptr<TrainingStrategy>> MakeHsdpStrategy(const StrategyContext& context);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MODES_HSDP_STRATEGY_H_
