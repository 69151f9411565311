"""A stand-in for the `expecttest` package, which Debian does not package.

torch.testing._internal.common_utils imports it for `ACCEPT` (whether --accept rewrites
expected outputs) and derives its TestCase from `expecttest.TestCase` (assertExpectedInline,
which the distributed suite does not use). This is enough for that import to succeed.
"""

import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    pass
