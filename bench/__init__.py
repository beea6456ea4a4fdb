"""oploop's benchmark (`./scripts/bench`): a stdlib harness over sections.

A section is a module of this package with

    def run(quick: bool) -> dict      # the figures (JSON-serialisable), medians of runs
    def table(result: dict) -> str    # those figures as a text table

`bench.__main__` runs the sections it finds (in `SECTIONS` order, then any
other module that has both functions), prints each table and writes the
whole result as JSON with the machine's core count and load average.
"""
