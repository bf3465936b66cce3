"""`diloco-admit`: keys and memberships of closed runs (PROTOCOL.md §7b, docs/deployment.md "Closed runs").

    diloco-admit id --key FILE                                  print the peer id of a key (created if missing)
    diloco-admit grant --key FOUNDER_KEY --run-id ID PEER_ID [-o FILE]
                                                                the founder admits PEER_ID: a membership file
    diloco-admit show FILE                                      check a membership file and print what it says

A membership names the run, the member and the founder, signed by the founder's key; the member starts
`diloco-node --run-id ID --key ITS_KEY --membership FILE`, and the founder `diloco-node --closed --key FOUNDER_KEY`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from protocol.admission import Membership, grant
from protocol.errors import LocalProtocolError
from protocol.identity import Identity


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="diloco-admit", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    commands = p.add_subparsers(dest="command", required=True)
    show_id = commands.add_parser("id", help="print the peer id of a key file (created, mode 0600, if missing)")
    show_id.add_argument("--key", required=True, type=Path, metavar="FILE")
    admit = commands.add_parser("grant", help="the founder admits a peer id to its closed run")
    admit.add_argument("--key", required=True, type=Path, metavar="FOUNDER_KEY",
                       help="the founder's key file (the key its node runs with --closed)")
    admit.add_argument("--run-id", required=True, metavar="ID")
    admit.add_argument("peer_id", metavar="PEER_ID", help="the new member's peer id (diloco-admit id on its machine)")
    admit.add_argument("-o", "--output", type=Path, default=None, metavar="FILE",
                       help="write the membership here (default: standard output)")
    show = commands.add_parser("show", help="verify a membership file and print what it grants")
    show.add_argument("file", type=Path, metavar="FILE")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "id":
            print(Identity.load_or_create(args.key).peer_id)
        elif args.command == "grant":
            founder = Identity.load(args.key)
            text = grant(founder, args.run_id, args.peer_id).to_json()
            if args.output is None:
                sys.stdout.write(text)
            else:
                args.output.write_text(text)
                print(f"admitted {args.peer_id} to run {args.run_id!r} (founder {founder.peer_id}): {args.output}",
                      file=sys.stderr)
        else:
            membership = Membership.from_json(args.file.read_text())
            print(f"run {membership.run_id!r}: {membership.member} admitted by founder {membership.founder} "
                  "(signature verifies)")
    except (OSError, ValueError, LocalProtocolError) as exc:
        print(f"diloco-admit: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
