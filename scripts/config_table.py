"""Rewrite the README's configuration table from podsrl.config.Config (the single source of truth).

    python scripts/config_table.py
"""

import re
from pathlib import Path

from podsrl.config import FIELDS

README = Path(__file__).resolve().parents[1] / "README.md"
rows = "\n".join(f"| `{name}` | `{f.default!r}` | {f.metadata['help']} |" for name, f in FIELDS.items())
table = "| field | default | meaning |\n| --- | --- | --- |\n" + rows + "\n"
text = README.read_text()
new, count = re.subn(r"\| field \| default \| meaning \|\n\| --- \| --- \| --- \|\n(?:\|.*\|\n)*", table, text)
assert count == 1, "README has no configuration table to replace"
README.write_text(new)
print(f"README: {len(FIELDS)} config fields")
