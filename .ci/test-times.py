#!/usr/bin/env python3
"""The slowest tests of nextest runs, from their JUnit files, as a Markdown table.

Usage: python3 .ci/test-times.py [N] [JUNIT...]
(default: 15, target/nextest/all/junit.xml and target/nextest/timed/junit.xml,
the two runs of `make test-all`; a missing file is skipped with a note).
"""
import sys
import xml.etree.ElementTree as ET

args = sys.argv[1:]
n = int(args.pop(0)) if args and args[0].isdigit() else 15
paths = args or ["target/nextest/all/junit.xml", "target/nextest/timed/junit.xml"]
cases = []
read = []
for path in paths:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"(skipped {path}: {e})", file=sys.stderr)
        continue
    read.append(path)
    for suite in root.iter("testsuite"):
        for case in suite.iter("testcase"):
            failed = case.find("failure") is not None or case.find("error") is not None
            cases.append((float(case.get("time", "0")), suite.get("name", ""), case.get("name", ""), failed))
if not read:
    sys.exit("no JUnit file: run `make test` or `make test-all` first")
cases.sort(reverse=True)
total = sum(c[0] for c in cases)
print(f"{len(cases)} tests, {total:.0f} s of test time in all ({', '.join(read)})\n")
print("| seconds | binary | test |")
print("| ---: | --- | --- |")
for secs, binary, name, failed in cases[:n]:
    print(f"| {secs:.1f} | {binary} | {name}{' (failed)' if failed else ''} |")
