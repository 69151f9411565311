// RequestLedger: the requests of each worker that one job has taken, so that a request
// delivered twice (the same sender rank and request id: a transport may duplicate a message,
// common/transport/faulty/faulty_transport.h) is served once and its copy is dropped.
//
// Request ids come from the worker's RpcEndpoint, unique per endpoint; a job's workers keep
// theirs for the job's life (a new worker process is a new job, with a new ledger). The ledger
// remembers the newest kWindow ids of each worker; an id older than all of them counts as new,
// so a real request is never dropped (a copy arrives right after its original in practice).
//
// Thread-safety: thread-safe.
#ifndef TESSERA_SERVER_PS_REQUEST_LEDGER_H_
#define TESSERA_SERVER_PS_REQUEST_LEDGER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>

namespace tessera::server {

class RequestLedger {
 public:
  static constexpr size_t kWindow = 256;

  // True the first time `request_id` of worker `rank` is seen; false for a repeat.
  bool FirstTime(int rank, uint64_t request_id);

 private:
  std::mutex mu_;
  std::map<int, std::set<uint64_t>> seen_;  // the newest kWindow ids by rank; guarded by mu_
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_REQUEST_LEDGER_H_
