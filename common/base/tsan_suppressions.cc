// ThreadSanitizer suppressions, compiled into every binary that uses ZeroMQ or civetweb.
//
// Debian's libzmq is not built with -fsanitize=thread, so TSan cannot see the happens-before
// edges of its lock-free pipes: a frame we hand to ZeroMQ on our I/O thread and ZeroMQ frees
// on its own I/O thread (through our free callback) looks like a race. Only reports with a
// libzmq frame in them are suppressed; races in our own code between our own threads still
// fail the build. The TSan runtime calls this hook at start-up; other builds never do.
//
// Debian's OpenBLAS is not instrumented either: its thread pool writes GEMM outputs (e.g. the
// gradient buffer) and hands them back to the caller through spin-waits TSan cannot see, so a
// later, properly ordered read on another thread (the transport sending the gradients) looked
// like a race with an OpenBLAS worker thread.
//
// libsodium is not instrumented either, and with CURVE libzmq's I/O thread decrypts each frame
// into the message buffer with it (crypto_secretbox_open_detached) before the pipe hands the
// message to our I/O thread: the unwinder loses the libzmq frame below libsodium's, so such a
// report names only libsodium. Tessera's own libsodium calls (MACs, key derivation) work on
// buffers of one thread.
//
// civetweb 1.15 calls gmtime(), whose result lives in one static buffer, from its worker
// threads (the Date header of an error answer, e.g. a request that did not arrive in time): two
// at once race on that buffer, and one answer may carry the other's date. A real race, but in
// civetweb and harmless to us; only reports with gmtime in them are suppressed (Tessera never
// calls it), not the rest of civetweb, whose threads run our page handlers.
extern "C" const char* __tsan_default_suppressions() {
  return "race:libzmq.so\n"
         "called_from_lib:libzmq.so\n"
         "race:libopenblas.so\n"
         "called_from_lib:libopenblas.so\n"
         "race:libsodium.so\n"
         "race:gmtime\n";
}
