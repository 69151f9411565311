#include "common/security/credentials.h"

#include <sodium.h>

#include <cstdlib>

#include "common/base/host_port.h"

namespace tessera {

CurveKeys JobCurveKeys(const JobKey& key) {
  if (sodium_init() < 0) std::abort();
  CurveKeys keys;
  keys.secret_key = key.Derive("curve");
  crypto_scalarmult_base(keys.public_key.data(), keys.secret_key.data());
  return keys;
}

std::string Credentials::Describe() const {
  std::string text;
  switch (protection) {
    case Protection::kNone:
      text = "NOT authenticated, not encrypted";
      break;
    case Protection::kAuthenticate:
      text = "authenticated (key " + key->Fingerprint() + "), not encrypted";
      break;
    case Protection::kEncrypt:
      text = "authenticated (key " + key->Fingerprint() + ") and encrypted";
      break;
  }
  return origin.empty() ? text : text + " (" + origin + ")";
}

bool IsEncryptChoice(std::string_view choice) {
  return choice == "auto" || choice == "on" || choice == "off";
}

StatusOr<Credentials> ResolveCredentials(bool insecure, std::string_view encrypt,
                                         const std::string& key_file,
                                         std::string_view listen_host,
                                         std::string_view coordinator_host) {
  if (!IsEncryptChoice(encrypt)) {
    return InvalidArgumentError("--encrypt=\"" + std::string(encrypt) +
                                "\": expected auto, on or off");
  }
  if (insecure) {
    if (encrypt == "on") {
      return InvalidArgumentError(
          "--insecure and --encrypt on contradict each other: encryption needs the job key");
    }
    Credentials none;
    none.origin = "--insecure: any process that reaches a port is trusted";
    return none;
  }
  if (key_file.empty()) {
    return FailedPreconditionError(
        std::string("no job key: every process of a job proves it belongs with the job's key. "
                    "tessera-launch makes one for its children; for processes started otherwise "
                    "(torchrun, mpirun, srun, by hand) create one with `tessera-launch "
                    "--make-key-file PATH`, give it to every process with --auth-key-file PATH "
                    "or ") +
        kAuthKeyFileVariable + "=PATH, or turn authentication off with --insecure");
  }
  ASSIGN_OR_RETURN(JobKey key, ReadKeyFile(key_file));
  bool on = encrypt == "on";
  std::string why = "--encrypt " + std::string(encrypt);
  if (encrypt == "auto") {
    if (!IsLoopbackHost(listen_host)) {
      on = true;
      why += ": listens on " + std::string(listen_host) + ", off the loopback";
    } else if (!coordinator_host.empty() && !IsLoopbackHost(coordinator_host)) {
      on = true;
      why += ": the coordinator is at " + std::string(coordinator_host) + ", off the loopback";
    } else {
      why += ": on the loopback";
    }
  }
  Credentials credentials = on ? Credentials::Encrypt(key) : Credentials::Authenticate(key);
  credentials.origin = "key file " + key_file + ", " + why;
  return credentials;
}

}  // namespace tessera
