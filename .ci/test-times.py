#!/usr/bin/env python3
"""The slowest tests of a nextest run, from its JUnit file, as a Markdown table.

Usage: python3 .ci/test-times.py [JUNIT] [N]   (default: target/nextest/all/junit.xml, 15)
"""
import sys
import xml.etree.ElementTree as ET

path = sys.argv[1] if len(sys.argv) > 1 else "target/nextest/all/junit.xml"
n = int(sys.argv[2]) if len(sys.argv) > 2 else 15
try:
    root = ET.parse(path).getroot()
except (OSError, ET.ParseError) as e:
    sys.exit(f"{path}: {e}; run `make test` or `make test-all` first")
cases = []
for suite in root.iter("testsuite"):
    for case in suite.iter("testcase"):
        failed = case.find("failure") is not None or case.find("error") is not None
        cases.append((float(case.get("time", "0")), suite.get("name", ""), case.get("name", ""), failed))
cases.sort(reverse=True)
total = sum(c[0] for c in cases)
print(f"{len(cases)} tests, {total:.0f} s of test time in all ({path})\n")
print("| seconds | binary | test |")
print("| ---: | --- | --- |")
for secs, binary, name, failed in cases[:n]:
    print(f"| {secs:.1f} | {binary} | {name}{' (failed)' if failed else ''} |")
