"""Test infrastructure shared by the test folders and the bench scripts (`fakeserver`: a fake SGLang stream)."""
