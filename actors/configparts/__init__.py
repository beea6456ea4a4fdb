"""The parts of `oploop.toml`, one module per concern; `actors.config` assembles them.

`checks` (the error and the type checks every table uses), `agents` (`[agents.NAME]`),
`limits` (`[router]`, `[limits]`, `[retention]`), `listen` (`[network]`, `[http]`).
"""
