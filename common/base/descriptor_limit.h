// Open file descriptors: a fleet's coordinator holds a connection per member and a watch on
// each (Transport::Watch), a server one per worker; the usual soft limit of 1024 would refuse
// the 1025th. Each Tessera process raises its soft limit to its hard limit at start (as Go's
// runtime does), which is never worse: nothing here passes descriptors to select().
#ifndef TESSERA_COMMON_BASE_DESCRIPTOR_LIMIT_H_
#define TESSERA_COMMON_BASE_DESCRIPTOR_LIMIT_H_

#include <cstdint>

namespace tessera {

// Raises RLIMIT_NOFILE's soft limit to its hard limit (to kMaxDescriptors when the hard one is
// unlimited). Returns the soft limit in force afterwards (the old one when raising failed).
uint64_t RaiseDescriptorLimit();

// The kernel's default ceiling on descriptors per process (fs.nr_open).
inline constexpr uint64_t kMaxDescriptors = uint64_t{1} << 20;

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_DESCRIPTOR_LIMIT_H_
