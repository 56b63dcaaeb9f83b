"""Tests of the sans-I/O core: vocabularies, grammar, accumulator, frame codecs, encoders,
errors, policy."""
