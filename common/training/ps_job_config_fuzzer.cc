// Fuzz target (issue 15): the PS job's configuration as a server receives it from the first
// worker (JSON in PsInitRequest: DecodePsJobConfig). What decodes encodes and decodes to the
// same again. Seeds: ps_job_config_fuzz_corpus/ (written by training_fuzz_seeds).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/training/ps_job.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  StatusOr<PsJobConfig> config =
      DecodePsJobConfig(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!config.ok()) return 0;
  const std::string encoded = EncodePsJobConfig(*config);
  StatusOr<PsJobConfig> again = DecodePsJobConfig(encoded);
  if (!again.ok() || EncodePsJobConfig(*again) != encoded) __builtin_trap();
  return 0;
}
