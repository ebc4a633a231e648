"""The `nsqlookupd` console script."""

import sys


def main() -> None:
    print("nsqlookupd: not implemented yet", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
