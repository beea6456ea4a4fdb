"""`python -m actors.executor`: run one tool executor."""

from actors.executor.actor import main

main()
