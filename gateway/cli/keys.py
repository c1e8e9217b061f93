"""``fairgate keys new NAME`` and ``fairgate keys hash``: make a key, and the line to paste.

The policy file is often readable by more than the admin (0644 under systemd), so it should
hold keys as ``sha256:`` digests; these commands print that form beside the key, so that
the plain key goes to its user and only its digest into the file. ``hash`` reads the key
from standard input, not from the command line, where ``ps`` and the shell history see it.
"""

from __future__ import annotations

import argparse
import getpass
import json
import secrets
import sys

import yaml

from gateway.config import UNKNOWN, hashed_key

__all__ = ["add_keys_arguments", "new_key"]

_PREFIX = "fg-"  # says where a key found in a file or a log belongs
_BYTES = 32  # 256 bits: as long as guessing is hopeless, short enough to paste


def add_keys_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="keys_command", required=True, metavar="{new,hash}")
    new = actions.add_parser("new", help="make a strong key for a user; print it and its digest")
    new.add_argument("name", help="the user the key is for (as under users: in the policy)")
    new.set_defaults(run=_new)
    hashed = actions.add_parser("hash", help="print the sha256: form of a key read from stdin")
    hashed.set_defaults(run=_hash)


def new_key() -> str:
    """A fresh random key: the prefix and 43 URL-safe characters (usable in a URL too)."""
    return _PREFIX + secrets.token_urlsafe(_BYTES)


def _new(args: argparse.Namespace) -> int:
    if args.name == UNKNOWN:
        print(f"fairgate keys new: {UNKNOWN!r} is what metrics call strangers", file=sys.stderr)
        return 2
    key = new_key()
    entry = f"{_yaml_key(args.name)}: {{keys: [{json.dumps(hashed_key(key))}]}}"
    print(f"key for {args.name} (give it to them; the gateway keeps only its digest):\n")
    print(f"    {key}\n")
    print("for the policy file, under users: (or add the sha256: line to their keys:):\n")
    print(f"  {entry}")
    return 0


def _yaml_key(name: str) -> str:
    """``name`` as a YAML mapping key: bare when YAML reads it back as that text (not for
    ``no``, ``1`` or ``a: b``), else quoted (JSON's quoting is YAML's)."""
    try:
        bare = yaml.safe_load(f"{name}: 0") == {name: 0}
    except yaml.YAMLError:
        bare = False
    return name if bare else json.dumps(name)


def _hash(args: argparse.Namespace) -> int:
    key = getpass.getpass("key (not shown): ") if sys.stdin.isatty() else sys.stdin.readline()
    # Clients send a key without surrounding blanks, and the gateway strips them too.
    key = key.strip()
    if not key:
        print("fairgate keys hash: no key on standard input", file=sys.stderr)
        return 1
    print(hashed_key(key))
    return 0
