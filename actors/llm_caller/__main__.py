"""`python -m actors.llm_caller`: run one llm caller."""

from actors.llm_caller.actor import main

main()
