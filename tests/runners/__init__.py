import pytest

# the shared Runner conformance suite is not a test_* module: ask pytest for its assertion details anyway
pytest.register_assert_rewrite("tests.runners.conformance")
