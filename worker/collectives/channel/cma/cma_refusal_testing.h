// For tests: make the kernel refuse cross-memory attach for real, as a container's seccomp
// profile does: a seccomp filter on the calling thread (and the children it forks) that fails
// process_vm_readv with EPERM. It cannot be removed: call it in a child process (or a thread
// that ends after the test).
#ifndef TESSERA_WORKER_COLLECTIVES_CHANNEL_CMA_CMA_REFUSAL_TESTING_H_
#define TESSERA_WORKER_COLLECTIVES_CHANNEL_CMA_CMA_REFUSAL_TESTING_H_

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstddef>

namespace tessera::worker {

// Whether the filter is in place.
inline bool RefuseCrossMemoryAttach() {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_COLLECTIVES_CHANNEL_CMA_CMA_REFUSAL_TESTING_H_
