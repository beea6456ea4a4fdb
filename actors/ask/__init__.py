"""`ask_machine`: this host's sessions ask the agent of another oploop host.

The tool runs in the supervisor (it needs no sandbox: it only talks to the peer,
over the bus's own client, TCP + CURVE with a key the other host issued). Modules:

- `peers`: the `[peers.NAME]` configuration, checked at start;
- `tool`: the tool's spec and the checking of a call's input;
- `relay`: which of the remote run's events reach the caller's viewers (capped);
- `link`: one ask, start to end: the remote run, its events, its lease, its cancel;
- `asker`: the supervisor's side: a client per peer, the asks, the cancels after.

Nothing here is imported by the host process (`peers` only, to check the config).
"""
