"""`convgen cache info | verify [--remove] | clear`: look after the on-disk kernel cache
(runtime/building/cache.py). Exit status 1 when verify finds bad entries and does not remove them."""

from __future__ import annotations

import json

from ..building import cache

EXIT_FAILED = 1


def add_parser(sub) -> None:
    parser = sub.add_parser("cache", help="the on-disk kernel cache: info, verify, clear")
    parser.add_argument("action", choices=["info", "verify", "clear"])
    parser.add_argument("--remove", action="store_true", help="verify: remove bad entries")
    parser.add_argument("--json", action="store_true", help="info: print as JSON")
    parser.set_defaults(run=cmd_cache)


def cmd_cache(args) -> int:
    if args.action == "info":
        info = cache.info()
        if args.json:
            print(json.dumps(info, indent=2))
        else:
            print(f"dir:     {info['dir']}\nentries: {info['entries']}\n"
                  f"bytes:   {info['bytes']} ({info['bytes'] / 1e6:.1f} MB)\n"
                  f"failed:  {info['failed']} failed build(s) kept")
        return 0
    if args.action == "clear":
        removed = cache.clear()
        print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {cache.root()}")
        return 0
    total = len(cache.entries())
    problems = cache.verify(remove=args.remove)
    for path, problem in problems:
        print(f"{'removed' if args.remove else 'bad'}: {path}: {problem}")
    print(f"{total - len(problems)} good, {len(problems)} bad{' (removed)' if args.remove and problems else ''} "
          f"of {total} entries in {cache.root()}")
    return EXIT_FAILED if problems and not args.remove else 0
