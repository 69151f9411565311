// RequestLedger: the requests of each worker that one job has taken, so that a request
// delivered twice (the same sender rank and request id) is served once. A copy comes from a
// transport that duplicates (common/transport/faulty/faulty_transport.h) or from the worker
// itself: a request without a reply is resent, with the same id, until its deadline
// (RpcEndpoint's resend_after_ms), because the request or its reply may have been lost.
//
//   switch (ledger.Take(rank, id)) {
//     case RequestLedger::kNew: ...serve it; later ledger.Answered(rank, id, reply)...
//     case RequestLedger::kTaken: return;  // the original is being served; its reply will go
//     case RequestLedger::kAnswered:       // the reply may have been lost: answer again
//       if (auto reply = ledger.ReplyOf(rank, id)) Send(*reply); else ...re-derive it...
//   }
//
// Request ids come from the worker's RpcEndpoint, unique per endpoint; a job's workers keep
// theirs for the job's life (a new worker process is a new job, with a new ledger). The ledger
// remembers the newest kWindow ids of each worker; an id older than all of them counts as new,
// so a real request is never dropped (a copy arrives within a few of the worker's requests).
//
// Thread-safety: thread-safe.
#ifndef TESSERA_SERVER_PS_REQUEST_LEDGER_H_
#define TESSERA_SERVER_PS_REQUEST_LEDGER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

#include "common/messages/message.h"

namespace tessera::server {

class RequestLedger {
 public:
  static constexpr size_t kWindow = 1024;

  enum Seen {
    kNew,       // the first time: serve it
    kTaken,     // a copy of a request still being served: drop it
    kAnswered,  // a copy of an answered request: answer it again
  };

  // Records request `request_id` of worker `rank` and says whether it was seen before.
  Seen Take(int rank, uint64_t request_id);
  // The request was answered; `reply`, when given, is kept to answer a copy with (small
  // replies: an Ack, an error, a checkpoint's files). Without it a copy is answered anew.
  void Answered(int rank, uint64_t request_id, std::optional<MessageBody> reply = std::nullopt);
  // The reply kept for an answered request, if any.
  std::optional<MessageBody> ReplyOf(int rank, uint64_t request_id);

 private:
  struct Entry {
    bool answered = false;
    std::optional<MessageBody> reply;
  };
  std::mutex mu_;
  std::map<int, std::map<uint64_t, Entry>> seen_;  // the newest kWindow ids by rank; mu_
};

}  // namespace tessera::server

#endif  // TESSERA_SERVER_PS_REQUEST_LEDGER_H_
