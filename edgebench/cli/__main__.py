"""`python -m edgebench.cli`: the same as the `edgebench` command."""

from edgebench.cli import main

main()
