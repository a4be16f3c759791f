"""`python -m railyard`: the `railyard` command, run by a chosen interpreter (the box and the
tests start Railyard this way, so a venv needs to be neither activated nor on the PATH)."""

from railyard.cli.main import main

if __name__ == "__main__":
    main()
