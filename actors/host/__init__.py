"""The host actor (`oploop up`): starts every other actor, restarts the ones that
die (with backoff and a restart-storm cap), and stops them all cleanly."""
