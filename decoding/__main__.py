"""``python -m decoding`` is no longer the command line: it moved above the library, to ``python -m playground``."""

import sys

MESSAGE = ("the command line moved: python -m playground run|bench|list ... "
           "(and python -m playground.train_prophet, python -m playground.train_consistency)")

if __name__ == "__main__":
    print(MESSAGE, file=sys.stderr)
    sys.exit(2)
