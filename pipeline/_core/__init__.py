"""The sans-I/O core: the vocabularies, the grammar, the accumulator, the frame codecs and
encoders, the wire decoder, the dialect protocol, the failure taxonomy and the policy arithmetic.

Nothing here does I/O or imports trio, httpx or anything above it."""
