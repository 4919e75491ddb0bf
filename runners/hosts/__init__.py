"""Host transport: the `Runner` protocol (`base`) and its implementations, `local` and `ssh`.

Every implementation passes the same conformance suite (tests/runners/conformance.py). `host_helper.py` is
the script the SSH runner and the host checks send to a host (`python -c`); it imports nothing of tunectl.
"""
