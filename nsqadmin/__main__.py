"""The `nsqadmin` console script."""

import sys


def main() -> None:
    print("nsqadmin: not implemented yet", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    main()
