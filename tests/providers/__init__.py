"""Tests of the dialects: each provider's wire, its recordings, the registry."""
