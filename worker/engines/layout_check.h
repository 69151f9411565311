// Before the first collective of a data-parallel run, every rank checks that all ranks are
// about to reduce the same tensors (names, shapes, order): a mismatch fails every rank with an
// error naming the rank and the tensor that differ, never a hang or a silently wrong sum.
//
// Cheap when the layouts agree (one all-gather of a few floats per rank); only on a mismatch
// does a second all-gather compare per-tensor fingerprints to name the first difference.
#ifndef TESSERA_WORKER_ENGINES_LAYOUT_CHECK_H_
#define TESSERA_WORKER_ENGINES_LAYOUT_CHECK_H_

#include <cstdint>

#include "common/base/status.h"
#include "common/training/parameter_layout.h"
#include "worker/collectives/collectives.h"

namespace tessera::worker {

// A collective: every rank calls it with its own layout. Uses tags `tag` and `tag + 1`.
// FailedPrecondition naming the differing rank and tensor when the layouts differ.
Status CheckLayoutsMatch(Collectives* collectives, const ParameterLayout& layout, uint64_t tag);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_ENGINES_LAYOUT_CHECK_H_
