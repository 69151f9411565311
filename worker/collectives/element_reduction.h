// Element arithmetic of the reducing collectives (collectives.h's table), shared by the ring
// (ring_collectives.cc) and direct reads (direct_read_collectives.cc): one Combine over a run
// of elements, for every dtype and reduce op. The why of it is above its code in the .cc.
#ifndef TESSERA_WORKER_COLLECTIVES_ELEMENT_REDUCTION_H_
#define TESSERA_WORKER_COLLECTIVES_ELEMENT_REDUCTION_H_

#include <cstddef>
#include <cstdint>

#include "common/base/data_type.h"
#include "common/messages/ring_frame.h"

namespace tessera::worker {

// out[i] = mine[i] (op) theirs[i] for i in [0, n) elements of `dtype`; `out` may be `mine`
// exactly and overlaps nothing else; `theirs` may be unaligned.
// `last`: this combination completes the reduction over every rank (average divides now).
// REQUIRES: op is defined for dtype (an average only of a floating dtype).
void Combine(DataType dtype, ReduceOp op, bool last, const uint8_t* mine, const uint8_t* theirs,
             uint8_t* out, size_t n, int world);

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_ELEMENT_REDUCTION_H_
