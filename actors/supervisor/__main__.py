"""`python -m actors.supervisor`: run the supervisor."""

from actors.supervisor.actor import main

main()
