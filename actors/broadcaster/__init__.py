"""The broadcaster actor: the per-session event log, the PUB stream, and replay.

Events arrive already sequenced from the supervisor (the single writer of each
session's `seq`); the broadcaster logs them, publishes each on the `events`
XPUB with the session id as topic, and serves any range of the log on
`replay`, so that a viewer attaching at any moment can catch up (Clone pattern).
"""
