"""Tests of the documentation: links resolve, quoted messages are the real ones."""
