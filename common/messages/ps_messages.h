// What workers and parameter servers tell each other, as plain values (server/ps/ serves
// them; worker/engines/ps_engine sends them).
//
//   PsInitRequest       rank 0 -> each server: the job and the initial values of the dense
//                       chunks the server owns (reply: Ack)
//   PsPushPullRequest   a worker's gradients of some chunks (or none: a pull); the reply,
//                       PsPushPullReply, carries their values once the consistency model
//                       allows
//   SparsePushRequest   embedding rows' gradients (reply: Ack)
//   SparsePullRequest   embedding rows by id (reply: SparsePullReply)
//   CheckpointRequest   write or restore this server's shard of a step (reply: CheckpointReply)
//
// Ranges: the keys server r owns with one copy of each (ServerKeyRange) and the embedding rows
// that hash to r (SparseRowOwner) are range r. With --replicas R, range r is held by servers
// r, r + 1, ..., r + R - 1 (mod the servers; the first live one is its primary), and every
// request names the range it is for (`range`; -1, as with R = 1: the server's own).
#ifndef TESSERA_COMMON_MESSAGES_PS_MESSAGES_H_
#define TESSERA_COMMON_MESSAGES_PS_MESSAGES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/messages/tensor_data.h"

namespace tessera {

struct PsInitRequest {
  std::string config;                // the job's configuration, JSON (common/training/ps_job.h)
  std::vector<TensorData> tensors;   // this server's dense chunks: "chunk<i>", key, values
  uint64_t job_token = 0;            // the same on every worker of a job, new for the next
  int32_t range = -1;  // the key range of the chunks (-1: the server's own; see below)
  // A copy of the range from another replica, for a server that joined: the shard's entries
  // (CheckpointReply::tensors) and the step they are of; the job starts from them. 0: no copy.
  std::vector<TensorData> copy = {};
  int64_t copy_step = 0;
};

struct PsPushPullRequest {
  std::vector<TensorData> tensors;  // chunks by key; bytes only with gradients
  bool has_gradients = false;
  uint64_t job_token = 0;  // a request of another job than the servers' waits for its init
  std::string model;       // a worker's first pull: DescribePsModel of its model, else empty
  // An offer of a shared region for this server's chunks (the worker is on its host; see
  // docs/parameter-server.md): its creator's pid and fd, and its token. fd -1: no offer.
  int64_t region_pid = 0;
  int64_t region_fd = -1;
  uint64_t region_token_high = 0;
  uint64_t region_token_low = 0;
  // Gradients and values travel in the mapped region; the tensors carry no bytes.
  bool in_region = false;
  // With has_gradients: this worker skips the step (its gradients held a NaN or Inf,
  // --on-nonfinite skip); the tensors name the chunks and carry no bytes.
  bool skip = false;
  // With has_gradients: this worker was asked to stop (read once per step: every request of
  // the step says the same). ps-sync: the workers stop after this step (see stopped_by).
  bool stop = false;
  int32_t range = -1;  // the key range of the chunks (-1: the server's own; see below)
  // A backup's reply leaves the values out (the worker has them from the range's primary):
  // its tensors only name the chunks.
  bool ack_only = false;
  // With has_gradients (ps-sync): the lowest server rank this worker knows joined in a failed
  // server's place (-1: none), read once per step like `stop` (see PsPushPullReply::joining).
  int32_t join = -1;
  // --replicas 2 (server/ps/ps_service.h, "Forwarded updates"): from a worker, the address
  // of the range's live backup (empty: none), to which the range's primary forwards each
  // update it applies. `forwarded`: this is such an update, from the primary. ps-sync: the
  // tensors are the chunks' averaged gradients of step header.step (no bytes when the step was
  // dropped because worker `dropped_by` skipped it), with the step's stop and join notes.
  // ps-async and ps-ssp: worker `pushed_by`'s push of step header.step, its gradients, and
  // each chunk's update number on the primary (`updates`, in tensor order).
  std::string forward_to = {};
  bool forwarded = false;
  int32_t dropped_by = -1;
  int32_t stopped_by = -1;
  int32_t joining = -1;
  int32_t pushed_by = -1;
  std::vector<int64_t> updates = {};
  // With an offer: the values halves after the gradients (one per copy of the range) and the
  // one this server writes (proto/wire.fbs).
  int32_t region_writers = 1;
  int32_t region_writer = 0;
};

struct PsPushPullReply {
  // The chunks asked for, in the request's order, with values (none: in_region).
  std::vector<TensorData> tensors;
  bool region_mapped = false;  // to an offer: mapped, else region_refusal says why
  std::string region_refusal;
  int skipped_by = -1;  // ps-sync: the worker that skipped the step this push was of (-1: none)
  // ps-sync: the lowest rank asked to stop (PsPushPullRequest::stop) in the step whose values
  // this reply carries, -1 when none was. Every chunk on every server says the same, so every
  // worker learns with the step's replies that all stop after it.
  int stopped_by = -1;
  // ps-sync: the lowest server rank a push of that step said joined (-1: none). Every chunk on
  // every server says the same, so every worker includes that server from the next step on.
  int joining = -1;
  // ps-async, ps-ssp: the push's updates were forwarded to the server at address `copied_to`,
  // which joined in a failed one's place and took a copy of the range
  // (CheckpointRequest::forward_to): it holds the range (empty: none). An address, so that a
  // later server of the same rank is not taken for it.
  std::string copied_to = {};
};

struct SparsePushRequest {
  std::string table;
  TensorData row_ids;  // int64
  TensorData values;   // float32, rows x dim
  int32_t range = -1;  // the range the rows hash to (-1: the server's own; see below)
  // --replicas 2, ps-async and ps-ssp (as PsPushPullRequest's): from a worker, the address of
  // the range's live backup (empty: none), to which the primary forwards the push once applied
  // and before its Ack. `forwarded`: such a push, from the primary: worker `pushed_by`'s rows
  // of header.step, the table's update `update` on the primary.
  std::string forward_to = {};
  bool forwarded = false;
  int32_t pushed_by = -1;
  int64_t update = 0;
};

struct SparsePullRequest {
  std::string table;
  TensorData row_ids;  // int64
  int32_t range = -1;  // the range the rows hash to (-1: the server's own; see below)
};

struct SparsePullReply {
  std::string table;
  TensorData row_ids;
  TensorData values;
  // ps-async, ps-ssp: the table's updates go to the server at this address, which joined in
  // a failed one's place, took a copy of the range and acknowledged one of them: it holds the
  // range (PsPushPullReply::copied_to's twin, for ranges without dense chunks; empty: none).
  std::string copied_to = {};
};

struct CheckpointRequest {
  std::string directory;  // the checkpoint root (common/training/checkpoint.h)
  int64_t step = 0;
  bool restore = false;  // false: write this server's shard of `step`; true: load it
  int32_t range = -1;    // the range whose shard (-1: the server's own; see below)
  // Write nothing: the reply carries the shard's entries (CheckpointReply::tensors).
  bool copy = false;
  // With copy, ps-async and ps-ssp (--replicas 2): the joined server that takes the copy, to
  // which the range's primary forwards every update after it from then on, so that the copy
  // and those updates are one cut; the entries then also carry each chunk's version and the
  // workers' clocks ("chunk<i>.clocks").
  std::string forward_to = {};
  int32_t forward_rank = -1;
};

struct CheckpointReply {
  std::string directory;
  int64_t step = 0;
  std::vector<std::string> files;  // shard files written, inside the step directory
  std::vector<uint64_t> bytes;     // their sizes
  std::vector<uint64_t> checksums;
  std::vector<TensorData> tensors = {};  // CheckpointRequest::copy: the shard's entries
};

}  // namespace tessera

#endif  // TESSERA_COMMON_MESSAGES_PS_MESSAGES_H_
