"""`python -m actors.host`: run a host in `$OPLOOP_HOME` until SIGTERM."""

from actors.host.actor import main

main()
