"""Tags of test targets that tools/test.sh --sanitizers reads (see its usage)."""

# A unit test of single-threaded code: ThreadSanitizer has nothing to see there, so
# tools/test.sh --sanitizers leaves it out of that configuration (and out of its build).
SINGLE_THREADED = ["no_tsan"]
