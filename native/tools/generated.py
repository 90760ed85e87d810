"""Writing generated files, or checking that the committed ones are current (the generators' --check)."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path


def write_or_check(files: dict[Path, str], check: bool, source: str) -> int:
    """check: 0 if every file holds its text, else 1, naming the stale ones with what differs (source: what the
    text was made from); otherwise the files are written.  The exit status for main()."""
    stale = [p for p, text in files.items() if not p.exists() or p.read_text() != text]
    if check:
        if stale:
            print("out of date:", ", ".join(p.name for p in stale))
            for p in stale:
                old = p.read_text().splitlines() if p.exists() else []
                sys.stdout.writelines(difflib.unified_diff(old, files[p].splitlines(), str(p), source, lineterm="\n",
                                                           n=0))
        return 1 if stale else 0
    for p, text in files.items():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    print("wrote", ", ".join(p.name for p in files))
    return 0


def error_table(struct: str, count: str, rows: list[tuple[int, str, str]]) -> str:
    """A C table of {code, "name", "text"} rows sorted by code (the shim bisects it), and its length as `count`."""
    out = [f"{struct}[] = {{\n"]
    for code, name, text in sorted(rows):
        text = text.replace("\\", "\\\\").replace('"', '\\"')
        out.append(f'    {{{code}, "{name}", "{text}"}},\n')
    name = struct.split()[-1]
    out.append(f"}};\nconst int {count} = (int)(sizeof {name} / sizeof {name}[0]);\n")
    return "".join(out)
