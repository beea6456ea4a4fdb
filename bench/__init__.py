"""`./scripts/bench`: oploop's figures, each section a module with `run(quick) -> dict`
and `table(result) -> str`."""
