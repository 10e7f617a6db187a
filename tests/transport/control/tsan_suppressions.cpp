// ThreadSanitizer suppressions for the control-plane tests. libzmq and libsodium (Debian's
// builds) are not instrumented: TSan cannot see the atomics libzmq's lock-free pipes synchronise
// with, nor libsodium decrypting into a message buffer on libzmq's I/O thread, and reports the
// hand-over of every message as a race. Ignoring what those two libraries do keeps the reports
// about our own threads (node I/O thread, callers of send(), test threads), which stay checked.
extern "C" const char* __tsan_default_suppressions() {
  return "called_from_lib:libzmq.so.5\n"
         "called_from_lib:libsodium.so.23\n"
         "race:libzmq.so.5\n"
         "race:libsodium.so.23\n";
}
