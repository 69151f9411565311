// Every metric Tessera exports, in one place: name and help text, with its type and label
// names in the comment above it (they are fixed at registration; see common/metrics/metrics.h).
//
//   registry->RegisterCounter(kBadMessagesTotal.name, kBadMessagesTotal.help, {"reason"});
//
// Conventions (checked by `promtool check metrics` in metrics_test): the `tessera_` prefix,
// base units (`_seconds`, `_bytes`), counters end in `_total`, and labels stay low-cardinality
// (role, rank, op, peer, type, reason; never tensor names or keys).
#ifndef TESSERA_COMMON_METRICS_METRIC_NAMES_H_
#define TESSERA_COMMON_METRICS_METRIC_NAMES_H_

#include <string_view>

namespace tessera::metric_names {

struct MetricName {
  std::string_view name;
  std::string_view help;
};

// --- Wire and transport ---

// counter; labels: reason.
inline constexpr MetricName kBadMessagesTotal{
    "tessera_bad_messages_total",
    "Inbound messages rejected before use (failed verification, bad version, too large)."};
// counter; labels: reason (malformed, wrong_key, expired, replayed, protocol: ZeroMQ's
// handshake; handshake: a ring link's).
inline constexpr MetricName kAuthFailuresTotal{
    "tessera_auth_failures_total",
    "Connections refused because the peer could not prove it holds the job's key."};
// counter; labels: type.
inline constexpr MetricName kMessagesReceivedTotal{"tessera_messages_received_total",
                                                   "Messages received, by message type."};
// counter; labels: type.
inline constexpr MetricName kMessagesSentTotal{"tessera_messages_sent_total",
                                               "Messages sent, by message type."};
// counter.
inline constexpr MetricName kBytesReceivedTotal{
    "tessera_bytes_received_total", "Bytes received over the transport, headers and payloads."};
// counter.
inline constexpr MetricName kBytesSentTotal{"tessera_bytes_sent_total",
                                            "Bytes sent over the transport, headers and payloads."};
// counter.
inline constexpr MetricName kSendFailuresTotal{
    "tessera_send_failures_total",
    "Outbound messages ZeroMQ refused (peer disconnected, connect failed); each is logged."};
// histogram (seconds); labels: type.
inline constexpr MetricName kRpcLatencySeconds{
    "tessera_rpc_latency_seconds", "Time from sending a request to receiving its reply."};
// counter; labels: type (the request's message type).
inline constexpr MetricName kRpcResentTotal{
    "tessera_rpc_resent_total",
    "Requests sent again, with the same id, because no reply came in time (the request or its "
    "reply may have been lost; the receiver serves a request once)."};

// --- Process ---

// gauge (unix time in seconds).
inline constexpr MetricName kProcessStartTimeSeconds{
    "tessera_process_start_time_seconds", "Start time of the process since the unix epoch."};
// gauge, always 1; labels: role, version.
inline constexpr MetricName kBuildInfo{"tessera_build_info",
                                       "Always 1; the labels say what this process runs."};

// --- Coordinator: fleet, heartbeats, barriers ---

// gauge; labels: role, state.
inline constexpr MetricName kFleetMembers{"tessera_fleet_members",
                                          "Processes in the fleet, by role and state."};
// counter.
inline constexpr MetricName kHeartbeatsReceivedTotal{"tessera_heartbeats_received_total",
                                                     "Heartbeats received from fleet members."};
// counter; labels: role.
inline constexpr MetricName kFailuresDetectedTotal{"tessera_failures_detected_total",
                                                   "Fleet members declared failed, by role."};
// gauge: the elastic job's membership epoch (0 until a worker leaves or joins; issue 47).
inline constexpr MetricName kMembershipEpoch{
    "tessera_membership_epoch", "The elastic job's membership epoch: its changes so far."};
// counter; labels: kind (join, exit, killed, error).
inline constexpr MetricName kMembershipChangesTotal{
    "tessera_membership_changes_total", "Workers that left or joined the elastic job, by kind."};
// histogram (seconds).
inline constexpr MetricName kBarrierWaitSeconds{
    "tessera_barrier_wait_seconds", "Time a process waited in a barrier for the others."};

// --- Parameter server (ps-* modes) ---

// gauge: dense chunk floats plus embedding rows' floats held, parameters only.
inline constexpr MetricName kPsParameterBytes{
    "tessera_ps_parameter_bytes", "Parameter bytes this server holds for the ps-* job."};
// gauge: 1 with --replicas 1; R when every range has its copies.
inline constexpr MetricName kPsKeyRanges{
    "tessera_ps_key_ranges",
    "Key ranges of the ps-* job this server holds: its own and those it keeps copies of."};
// gauge.
inline constexpr MetricName kPsOptimizerStateBytes{
    "tessera_ps_optimizer_state_bytes", "Optimizer state bytes this server holds."};
// counter; labels: kind (dense, sparse).
inline constexpr MetricName kPsUpdatesTotal{
    "tessera_ps_updates_total", "Optimizer updates applied (one per chunk or table per update)."};
// counter; labels: kind (dense, sparse).
inline constexpr MetricName kPsGradientBytesTotal{
    "tessera_ps_gradient_bytes_total", "Gradient bytes received by pushes."};
// counter.
inline constexpr MetricName kPsValuesCopiesTotal{
    "tessera_ps_values_copies_total",
    "Dense chunks whose values were copied before an update because a reply was still sending "
    "them (replies send the values without a copy; an update then writes a fresh copy)."};
// counter; labels: kind (dense, sparse).
inline constexpr MetricName kPsNonFinitePushesTotal{
    "tessera_ps_nonfinite_pushes_total",
    "Pushes refused because a gradient held NaN or Inf (nothing of them was applied)."};
// counter.
inline constexpr MetricName kPsSkippedUpdatesTotal{
    "tessera_ps_skipped_updates_total",
    "ps-sync chunk updates dropped because a worker skipped the step (a NaN or Inf in its "
    "gradients, --on-nonfinite skip)."};
// counter.
inline constexpr MetricName kPsRepeatedRequestsTotal{
    "tessera_ps_repeated_requests_total",
    "Requests that arrived again (resent by their worker after a lost request or reply, or "
    "duplicated on the way): served once, answered again."};
// gauge.
inline constexpr MetricName kPsStaleness{
    "tessera_ps_staleness_steps",
    "Current gap between the fastest and the slowest worker's last pushed step."};
// gauge.
inline constexpr MetricName kPsMaxReleasedStaleness{
    "tessera_ps_max_released_staleness_steps",
    "Largest lead over the slowest worker with which a push-pull reply was released (ps-ssp "
    "keeps it <= --staleness)."};
// gauge.
inline constexpr MetricName kPsWaitingRequests{
    "tessera_ps_waiting_requests", "Requests held back by the consistency model right now."};
// histogram (seconds); labels: op (push_pull, sparse_push, sparse_pull, init).
inline constexpr MetricName kPsClientLatencySeconds{
    "tessera_ps_client_latency_seconds",
    "Worker-side time from sending a parameter-server request to its reply."};
// counter; labels: op (push_pull, sparse_push, sparse_pull; sparse ops count row ids too).
inline constexpr MetricName kPsClientBytesSentTotal{
    "tessera_ps_client_bytes_sent_total", "Tensor bytes workers sent to servers, by operation."};
// counter; labels: op (as kPsClientBytesSentTotal).
inline constexpr MetricName kPsClientBytesReceivedTotal{
    "tessera_ps_client_bytes_received_total",
    "Tensor bytes workers received from servers, by operation."};
// counter: --replicas R > 1.
inline constexpr MetricName kPsClientFailoversTotal{
    "tessera_ps_client_failovers_total",
    "Servers this worker carried on without (their key ranges' other replicas serve them)."};
// counter: --replicas R > 1.
inline constexpr MetricName kPsClientRetargetedTotal{
    "tessera_ps_client_retargeted_total",
    "Requests asked again of a key range's new primary after its primary failed."};

// counter: --replicas R > 1, worker rank 0 (which makes the copies).
inline constexpr MetricName kPsClientRangeCopiesTotal{
    "tessera_ps_client_range_copies_total",
    "Key ranges copied to a server that joined in a failed server's place."};

// --- Collectives and the all-reduce (DDP) engine ---

// histogram (seconds); labels: op (allreduce, broadcast, allgather, reducescatter; the torch
// backend's ops by torch's names: reduce, gather, scatter, reduce_scatter, alltoall, barrier,
// send, recv), size_class (<64KiB, <1MiB, <16MiB, >=16MiB).
inline constexpr MetricName kCollectiveSeconds{
    "tessera_collective_seconds", "Time of one collective operation, by operation and size."};
// counter; labels: op.
inline constexpr MetricName kCollectiveBytesTotal{
    "tessera_collective_bytes_total", "Bytes of the buffers reduced or gathered, by operation."};
// counter; labels: op (as kCollectiveSeconds).
inline constexpr MetricName kCollectiveErrorsTotal{
    "tessera_collective_errors_total",
    "Collective and point-to-point operations that ended with an error, by operation."};
// gauge.
inline constexpr MetricName kDdpBucketsInFlight{
    "tessera_ddp_buckets_in_flight", "Gradient buckets queued or being all-reduced right now."};
// gauge.
inline constexpr MetricName kDdpOverlapRatio{
    "tessera_ddp_overlap_ratio",
    "Share of the last step's communication time that ran while backward was still computing."};
// gauge; labels: kind (parameters, gradients, optimizer_state).
inline constexpr MetricName kModelStateBytes{
    "tessera_model_state_bytes",
    "Bytes of model state this rank holds between steps, by kind (ZeRO partitions them)."};
// gauge{kind}: parameters, gradients, optimizer_state.
inline constexpr MetricName kModelStatePeakBytes{
    "tessera_model_state_peak_bytes",
    "Most bytes of model state this rank held at once during the last step, by kind (with "
    "ZeRO stage 3's gathered layers and the gradient blocks awaiting reduce-scatter)."};
// histogram (seconds).
inline constexpr MetricName kDdpWaitSeconds{
    "tessera_ddp_wait_seconds",
    "Time the optimizer step waited for gradient all-reduces after backward finished."};

// --- FSDP of PyTorch processes (tessera.torch.fsdp, worker/torch/fsdp_metrics.h) ---

// gauge; labels: kind (shard, gathered, gradient_shard, full_gradient).
inline constexpr MetricName kFsdpParamBytes{
    "tessera_fsdp_param_bytes",
    "Bytes of FSDP flat parameters and gradients this rank holds now, by kind: shard (its "
    "parameter shards), gathered (unsharded parameters allocated), gradient_shard (sharded "
    "gradients), full_gradient (unsharded gradients awaiting reduce-scatter)."};
// gauge; labels: kind (as kFsdpParamBytes).
inline constexpr MetricName kFsdpParamPeakBytes{
    "tessera_fsdp_param_peak_bytes",
    "Most bytes tessera_fsdp_param_bytes of the kind reached since the process started or its "
    "peaks were last reset (tessera.torch._C.fsdp_reset_peaks)."};
// histogram (seconds); labels: op (all_gather, reduce_scatter, all_reduce).
inline constexpr MetricName kFsdpCollectiveSeconds{
    "tessera_fsdp_collective_seconds",
    "Time from an FSDP collective's issue to its completion as FSDP sees it, by operation "
    "(all_reduce: the replicate step of hybrid sharding)."};
// counter; labels: op (as kFsdpCollectiveSeconds).
inline constexpr MetricName kFsdpCollectiveBytesTotal{
    "tessera_fsdp_collective_bytes_total",
    "Bytes of the unsharded buffers FSDP gathered, reduce-scattered or all-reduced, by "
    "operation."};
// counter.
inline constexpr MetricName kFsdpPrefetchWaitsTotal{
    "tessera_fsdp_prefetch_waits_total",
    "Times FSDP needed a prefetched all-gather that had not finished and waited for it."};
// counter (seconds).
inline constexpr MetricName kFsdpPrefetchWaitSecondsTotal{
    "tessera_fsdp_prefetch_wait_seconds_total",
    "Seconds FSDP spent waiting for prefetched all-gathers that had not finished."};

// --- Training (every mode, on workers) ---

// gauge: the last finished optimizer step.
inline constexpr MetricName kTrainStep{"tessera_train_step", "The last finished training step."};
// gauge.
inline constexpr MetricName kTrainLoss{"tessera_train_loss",
                                       "Mean training loss of the last step's batch."};
// counter.
inline constexpr MetricName kTrainNonFiniteStepsTotal{
    "tessera_nonfinite_steps_total",
    "Steps whose gradients held NaN or Inf and were skipped (--on-nonfinite skip)."};
// counter.
inline constexpr MetricName kTrainSamplesTotal{"tessera_train_samples_total",
                                               "Training samples this worker has processed."};
// histogram (seconds); labels: phase (data, compute, engine).
inline constexpr MetricName kTrainStepPhaseSeconds{
    "tessera_train_step_phase_seconds",
    "Time per training step by phase: data (batch assembly, embedding rows), compute (forward "
    "and backward), engine (communication, waiting and the optimizer step)."};
// gauge.
inline constexpr MetricName kTrainEvalAccuracy{"tessera_train_eval_accuracy",
                                               "Accuracy of the last evaluation."};

// --- Pipeline parallelism (worker/pipeline/pipeline_metrics.h), native and PyTorch ---

// counter; labels: stage.
inline constexpr MetricName kPipelineBusySecondsTotal{
    "tessera_pipeline_busy_seconds_total",
    "Seconds this rank computed forwards and backwards of the pipeline stage, over every step."};
// counter.
inline constexpr MetricName kPipelineIdleSecondsTotal{
    "tessera_pipeline_idle_seconds_total",
    "Seconds of pipeline steps this rank computed nothing: its bubble, waits for messages and "
    "the step's own bookkeeping."};
// counter.
inline constexpr MetricName kPipelineStepsTotal{"tessera_pipeline_steps_total",
                                                "Pipeline steps this rank finished."};
// counter; labels: kind (activation, gradient).
inline constexpr MetricName kPipelineSentBytesTotal{
    "tessera_pipeline_sent_bytes_total",
    "Bytes of activations (to the next stage) and gradients (to the stage before) this rank "
    "sent."};
// gauge.
inline constexpr MetricName kPipelineMicroBatchesHeld{
    "tessera_pipeline_micro_batches_held",
    "The most micro-batches whose activations this rank held at once in the last step."};
// gauge.
inline constexpr MetricName kPipelineMicroBatchesHeldBound{
    "tessera_pipeline_micro_batches_held_bound",
    "The most micro-batches the schedule lets this rank hold at once."};
// gauge.
inline constexpr MetricName kPipelineRank{
    "tessera_pipeline_rank", "This rank's place in its pipeline (0 runs the first stage)."};
// gauge.
inline constexpr MetricName kPipelineBubbleFormula{
    "tessera_pipeline_bubble_formula",
    "The idle share of a step the schedule predicts for equal-cost stages, as a fraction."};
// gauge.
inline constexpr MetricName kPipelineLastStepStartSeconds{
    "tessera_pipeline_last_step_start_seconds",
    "When the last step began, in seconds since the Unix epoch."};
// gauge.
inline constexpr MetricName kPipelineLastStepSeconds{
    "tessera_pipeline_last_step_seconds", "How long the last step took, in seconds."};
// gauges; labels: op (F, B, I, W), stage, micro_batch.
inline constexpr MetricName kPipelineActionStartSeconds{
    "tessera_pipeline_action_start_seconds",
    "When a compute action of the last step began, in seconds after the step's start (NaN: "
    "not in the last step)."};
inline constexpr MetricName kPipelineActionEndSeconds{
    "tessera_pipeline_action_end_seconds",
    "When a compute action of the last step ended, in seconds after the step's start (NaN: "
    "not in the last step)."};

}  // namespace tessera::metric_names

#endif  // TESSERA_COMMON_METRICS_METRIC_NAMES_H_
