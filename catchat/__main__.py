"""`python -m catchat ...` runs the command-line interface (same as the `catchat` script)."""

from catchat.cli import main

main()
