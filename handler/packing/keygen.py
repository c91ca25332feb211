"""`./archive.sh keygen` (`ts-llm-build keygen`): a new fleet key pair for signed artifacts.

The private key stays where builds run (archive.sh --signing-key, or TS_LLM_SIGNING_KEY; the
sidecar's cache_signing_key where pods publish too); the public key goes into every pod's
sidecar config (cache_public_key), e.g. from a Secret. See docs/operations.md, Signed artifacts.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from handler.cache.signing import generate_key_pair


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="archive.sh keygen", description=__doc__.split("\n")[0])
    p.add_argument("--private-key", type=Path, required=True, help="where to write the private key "
                   "(PEM, mode 0600; never overwritten)")
    p.add_argument("--public-key", type=Path, required=True, help="where to write the public key (PEM)")
    args = p.parse_args(argv)
    try:
        key_id = generate_key_pair(args.private_key, args.public_key)
    except OSError as err:  # FileExistsError included: a fleet key is never replaced by accident
        print(f"archive.sh keygen: error: {err}", file=sys.stderr)
        return 2
    print(f"key {key_id}: private {args.private_key}, public {args.public_key}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
