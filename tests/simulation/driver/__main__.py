"""The command line: `python -m tests.simulation.driver --seeds N [--start K]`, or `--seed S -v` to replay one."""

from __future__ import annotations

import argparse
import sys
import time

import tests.simulation.driver
from tests.simulation.driver.run import run_seed


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.simulation.driver",
        description=tests.simulation.driver.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, default=100, help="run seeds 0..N-1")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--seed", type=int, help="replay this one seed")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    failed = []
    started = time.perf_counter()
    for seed in seeds:
        try:
            result = run_seed(seed, args.verbose)
        except AssertionError as exc:
            failed.append(seed)
            print(f"seed {seed} failed: {exc}  (replay: python -m tests.simulation.driver --seed {seed} -v)")
            continue
        if args.verbose or args.seed is not None:
            print(f"seed {seed}: applied {result.applied}, trace {result.digest}, {result.stats}")
    elapsed = time.perf_counter() - started
    rate = len(seeds) / elapsed
    print(f"{len(seeds) - len(failed)} passed, {len(failed)} failed in {elapsed:.1f}s ({rate:.2f} seeds/s)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
