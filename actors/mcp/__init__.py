"""MCP tool servers: their configuration (`config`, no SDK), and in the executors the
connections that run them (`servers`, `transport`, `results`, `hub`: the `mcp` SDK).

See docs/mcp.md.
"""
