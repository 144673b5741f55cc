"""Write docs/configuration.md from podsrl.config.Config, the single source of truth
(tests/test_docs.py fails when the page and the config disagree).

    python scripts/config_table.py
"""

from pathlib import Path

from podsrl.config import FIELDS

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
HEADER = """# Configuration

One frozen dataclass, `podsrl.config.Config`, is the single source of truth; this page is
generated from it by `python scripts/config_table.py`. Values come from the defaults
below, then `--config FILE.yaml`, then `--field value` options (`podsrl train --help`
lists the same). Every value is validated before any work, with errors that name the
field (and the YAML file and line). A field that names a component (`downsampling_rule`,
`advantage_estimator`, `loss_type`, `generation_engine`, `generation_schedule`, `task`,
`reward_funcs`, `prompt_selector`) also takes a mapping of its name and keyword arguments,
`{name: ..., argument: value}` ([algorithms.md](algorithms.md#components-with-arguments)).

```bash
podsrl train --config configs/tiny-lora.yaml --learning_rate 5e-4 --output_dir runs/from-yaml
```

"""


def render() -> str:
    rows = "\n".join(f"| `{name}` | `{f.default!r}` | {f.metadata['help']} |" for name, f in FIELDS.items())
    return HEADER + "| field | default | meaning |\n| --- | --- | --- |\n" + rows + "\n"


if __name__ == "__main__":
    PAGE.write_text(render())
    print(f"{PAGE}: {len(FIELDS)} config fields")
