// Credentials: how a process proves it belongs to its job, and whether its traffic is
// encrypted. Resolved once from the flags (--insecure, --encrypt, --auth-key-file) and handed to
// every transport and channel the process opens.
//
//   protection      ZeroMQ sockets                          ring links (raw TCP)
//   kNone           NULL mechanism: anyone is admitted      no handshake
//   kAuthenticate   PLAIN + ZAP with one-time MAC tokens    challenge-response handshake
//   kEncrypt        CURVE + ZAP, keys derived from the key  handshake, then an AEAD stream
//
// `--encrypt auto` (the default) encrypts when the process listens on an address other than
// the loopback, or its coordinator is at one: the kernel isolates loopback traffic, and a
// network does not. Every process of a job must resolve alike, and they do: all share the
// coordinator's host. (One that listens on 0.0.0.0 while its peers reach it at 127.0.0.1
// encrypts alone; the handshake then fails, and both sides log that the mechanisms differ.)
//
// Thread-safety: an immutable value.
#ifndef TESSERA_COMMON_SECURITY_CREDENTIALS_H_
#define TESSERA_COMMON_SECURITY_CREDENTIALS_H_

#include <memory>
#include <string>
#include <string_view>

#include "common/base/status.h"
#include "common/security/job_key.h"

namespace tessera {

enum class Protection { kNone, kAuthenticate, kEncrypt };

struct Credentials {
  Protection protection = Protection::kNone;
  std::shared_ptr<const JobKey> key;  // null exactly when protection is kNone
  // How it was decided, for Describe(): "key file /tmp/k, --encrypt auto: listens on 127.0.0.1".
  std::string origin;

  static Credentials None() { return Credentials(); }
  static Credentials Authenticate(const JobKey& key) {
    return {Protection::kAuthenticate, std::make_shared<const JobKey>(key), ""};
  }
  static Credentials Encrypt(const JobKey& key) {
    return {Protection::kEncrypt, std::make_shared<const JobKey>(key), ""};
  }

  bool authenticated() const { return protection != Protection::kNone; }
  bool encrypted() const { return protection == Protection::kEncrypt; }

  // For the startup log: "authenticated (key 1a2b3c4d), not encrypted (key file /tmp/k,
  // --encrypt auto: listens on 127.0.0.1)"; "NOT authenticated (--insecure)".
  std::string Describe() const;
};

// The environment variable naming the key file, for processes that torchrun, mpirun or Slurm
// start (and the children of tessera-launch).
inline constexpr char kAuthKeyFileVariable[] = "TESSERA_AUTH_KEY_FILE";

// `insecure`: --insecure; `encrypt`: "auto", "on" or "off"; `key_file`: --auth-key-file (or
// the variable's value), required unless insecure; `listen_host`: where the process's sockets
// listen (an IP address) and `coordinator_host` the host of its coordinator ("" for none),
// which decide `auto`. Errors say what to do: no key file names --auth-key-file,
// TESSERA_AUTH_KEY_FILE, `tessera-launch --make-key-file` and --insecure.
StatusOr<Credentials> ResolveCredentials(bool insecure, std::string_view encrypt,
                                         const std::string& key_file,
                                         std::string_view listen_host,
                                         std::string_view coordinator_host);

// The CURVE key pair every process of a job uses when encrypting: the secret key is the job
// key's "curve" subkey, so holding the job key is what proves membership either way.
struct CurveKeys {
  KeyBytes public_key;
  KeyBytes secret_key;
};
CurveKeys JobCurveKeys(const JobKey& key);

// Whether `choice` is a valid --encrypt value.
bool IsEncryptChoice(std::string_view choice);

}  // namespace tessera

#endif  // TESSERA_COMMON_SECURITY_CREDENTIALS_H_
