// ProcessAlive: whether a process of this host (this PID namespace) is still running.
//
// Used to learn at once that a neighbour on the same host died, where a protocol would
// otherwise wait for a timeout: a shared-memory ring's peer, a fleet member registered from
// the coordinator's host.
//
// Thread-safety: a plain function.
#ifndef TESSERA_COMMON_BASE_PROCESS_ALIVE_H_
#define TESSERA_COMMON_BASE_PROCESS_ALIVE_H_

#include <sys/types.h>

namespace tessera {

// False once `pid` has exited. A killed process that its parent has not reaped yet still
// answers kill(pid, 0), so its state in /proc counts too (a zombie is not alive). A process
// of another user counts as alive.
bool ProcessAlive(pid_t pid);

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_PROCESS_ALIVE_H_
