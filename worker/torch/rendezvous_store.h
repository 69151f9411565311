// RendezvousStore: the key-value store the ranks of a process group meet through. torch hands
// every process group a c10d::Store (TCPStore, FileStore, ... behind a PrefixStore of the
// group); process_group_tessera.cc adapts it to this interface, so the rest of worker/torch
// needs no torch headers, and tests can use an in-memory store.
//
// Thread-safety: implementations are thread-safe.
#ifndef TESSERA_WORKER_TORCH_RENDEZVOUS_STORE_H_
#define TESSERA_WORKER_TORCH_RENDEZVOUS_STORE_H_

#include <string>

#include "common/base/deadline.h"
#include "common/base/status.h"

namespace tessera::worker {

class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;

  // Sets `key` to `value` (a later Set replaces it).
  virtual Status Set(const std::string& key, const std::string& value) = 0;

  // The value of `key`, waiting until some rank sets it. DeadlineExceeded naming the key once
  // `deadline` passes.
  virtual StatusOr<std::string> Get(const std::string& key, Deadline deadline) = 0;
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_TORCH_RENDEZVOUS_STORE_H_
