"""`python -m actors.broadcaster`: run the broadcaster."""

from actors.broadcaster.actor import main

main()
