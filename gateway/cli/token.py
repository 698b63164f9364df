"""``recalld token add|list|revoke``: tokens for a user's other clients (an MCP agent, a phone,
a remote machine), each with its own name, revocable alone, optionally read-only.

Works on the data directory directly, like ``recalld token`` itself: the daemon re-reads
``<data dir>/clients.json`` when it changes (:class:`gateway.auth.ClientTokens`), so nothing
here needs it running, and a token added or revoked counts from the daemon's next sign-in.

* ``add NAME [--read-only] [--file PATH] [--user USER]`` mints a token. With ``--file`` it is
  written there, 0600 (missing parent folders are made 0700; a symlink is refused, so the token
  never lands where a link points); without, it is printed once on stdout. Only its SHA-256 is
  kept, so it cannot be shown again: lost, it is revoked and added anew.
* ``list`` shows name, access, user and creation time, never a token.
* ``revoke NAME`` removes one; a running daemon refuses it from its next sign-in.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

from gateway.auth import DEFAULT_USER, ClientTokenError, ClientTokens, clients_path
from gateway.config import Config

__all__ = ["add_token_subcommands", "run_token_command"]


def add_token_subcommands(token: argparse.ArgumentParser,
                          command_flags: Callable[[argparse.ArgumentParser], None]) -> None:
    sub = token.add_subparsers(dest="token_command", metavar="{add,list,revoke}")
    add = sub.add_parser("add", help="mint a token for another client of this user (shown once)")
    command_flags(add)
    add.add_argument("name",
                     help="the client's name (letters, digits, . _ -), shown on the facts it saves")
    add.add_argument("--read-only", action="store_true",
                     help="it may search and read, never write or forget")
    add.add_argument("--file", type=Path,
                     help="write the token to this file (0600) instead of printing it")
    add.add_argument("--user",
                     help="whose client it is (needed with [[auth.users]]; default: default)")
    listed = sub.add_parser("list",
                            help="the client tokens: name, access, user, created (never the token)")
    command_flags(listed)
    revoke = sub.add_parser("revoke",
                            help="remove a client's token; the daemon refuses it from then on")
    command_flags(revoke)
    revoke.add_argument("name")


def run_token_command(config: Config, args: argparse.Namespace) -> int:
    tokens = ClientTokens(clients_path(config.data_dir))
    try:
        if args.token_command == "add":
            return _add(config, tokens, args)
        if args.token_command == "list":
            return _list(config, tokens)
        gone = tokens.revoke(args.name)
    except ClientTokenError as exc:
        print(f"recalld: {exc}", file=sys.stderr)
        return 1
    print(f"revoked {gone.name}; the daemon refuses its token from its next sign-in",
          file=sys.stderr)
    return 0


def _add(config: Config, tokens: ClientTokens, args: argparse.Namespace) -> int:
    if config.auth.mode == "none":
        print("recalld: auth.mode = \"none\": the daemon checks no token, so a client token would "
              "limit nothing", file=sys.stderr)
        return 1
    users = [u.name for u in config.auth.users] or [DEFAULT_USER]
    user = args.user or (users[0] if len(users) == 1 else None)
    if user not in users:
        named = (f"--user {args.user!r} is not" if args.user
                 else "name the user with --user; it must be")
        print(f"recalld: {named} one of the configured users ({', '.join(users)})", file=sys.stderr)
        return 2
    target = args.file.expanduser() if args.file is not None else None
    if target is not None:
        refusal = _unsafe(target)
        if refusal:
            print(f"recalld: --file {target}: {refusal}", file=sys.stderr)
            return 2
    token = tokens.add(args.name, user=user, read_only=args.read_only)
    access = "read-only" if args.read_only else "read-write"
    if target is None:
        print(token)
        print(f"token for client {args.name} ({access}, user {user}) shown once: only its "
              "hash is kept", file=sys.stderr)
        return 0
    try:
        _write_private_file(target, token)
    except OSError as exc:
        tokens.revoke(args.name)  # a token nobody holds is only a risk
        print(f"recalld: --file {target}: cannot write: {exc.strerror or exc}; nothing was added",
              file=sys.stderr)
        return 1
    print(f"token for client {args.name} ({access}, user {user}) written to {target}",
          file=sys.stderr)
    return 0


def _list(config: Config, tokens: ClientTokens) -> int:
    listed = tokens.listed()
    if not listed:
        print("no client tokens (add one: recalld token add NAME [--read-only] [--file PATH])",
              file=sys.stderr)
        return 0
    rows = [("NAME", "ACCESS", "USER", "CREATED")] + [
        (t.name, "read-only" if t.read_only else "read-write", t.user, t.created) for t in listed]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False))
              + "  " + row[3])
    return 0


def _unsafe(path: Path) -> str | None:
    """Why the token must not be written at ``path``, or None."""
    if path.is_symlink():
        return "is a symbolic link; give the real path (a link could point the token anywhere)"
    if path.exists() and not path.is_file():
        return "exists and is not a regular file"
    return None


def _write_private_file(path: Path, token: str) -> None:
    # Folders made here are 0700 (the token's folder should be no one else's); existing ones
    # (the home folder, say) are left as they are.
    missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
    for folder in reversed(missing):
        folder.mkdir(mode=0o700)
        os.chmod(folder, 0o700)  # mkdir's mode passes through the umask
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    # Created 0600 and never through a link (O_NOFOLLOW, O_EXCL); renamed over the target, so a
    # reader sees the old token or the new one, never half of one.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
