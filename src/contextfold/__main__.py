"""``python -m contextfold``: the same command as the ``contextfold`` console script."""

from contextfold.cli import main

if __name__ == "__main__":
    main()
