"""Tests of `ngcx dashboard` (a package: its test_images.py would otherwise clash with tests/workstation/'s)."""
