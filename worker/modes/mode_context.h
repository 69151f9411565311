// ModeContext: where a mode of tessera-worker runs: the process, the modes' flags and, for a
// fleet member, its rendezvous client and the wiring to its peers. main() fills it once the
// worker joined the fleet (or for a mode that trains alone, without one) and hands it to the
// mode's factory or job (mode_registry.h).
//
// Thread-safety: plain structs; what they point to states its own.
#ifndef TESSERA_WORKER_MODES_MODE_CONTEXT_H_
#define TESSERA_WORKER_MODES_MODE_CONTEXT_H_

#include <memory>

#include "common/base/failure_bus.h"
#include "common/process/process_runtime.h"
#include "common/rendezvous/rendezvous_client.h"
#include "worker/collectives/channel/zmq/collective_mailbox.h"
#include "worker/modes/mode_flags.h"

namespace tessera::worker {

// What a worker of the fleet uses to talk to its peers: the mailbox its endpoint delivers ring
// frames to, and the bus its rendezvous client posts failures on.
struct PeerWiring {
  std::shared_ptr<FailureBus> failures;
  std::shared_ptr<CollectiveMailbox> mailbox;
};

// REQUIRES: runtime and flags outlive whatever the mode builds from this context; so does
// client when not null.
struct ModeContext {
  ProcessRuntime* runtime = nullptr;
  const ModeFlags* flags = nullptr;
  RendezvousClient* client = nullptr;  // null: standalone (a mode that trains alone)
  PeerWiring wiring;                   // empty when standalone
};

}  // namespace tessera::worker

#endif  // TESSERA_WORKER_MODES_MODE_CONTEXT_H_
