"""`python -m loadgen` runs the same command as `pagode-loadgen`."""

from loadgen.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
