"""`python -m catchat.cli ...`: the same as the `catchat` command."""

from catchat.cli import main

main()
