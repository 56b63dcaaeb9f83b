"""The turn on trio: the source actor (handler), the actor graph, the turn and its handle,
hedging, limits (admission, rate limiter), the run stream of several turns, the provider chain."""
