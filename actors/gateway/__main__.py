"""`python -m actors.gateway`: run the gateway."""

from actors.gateway.actor import main

main()
