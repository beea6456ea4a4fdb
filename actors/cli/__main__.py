"""`python -m actors.cli`: the `oploop` command."""

from actors.cli import main

main()
