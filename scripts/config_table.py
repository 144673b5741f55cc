"""Write docs/configuration.md and the command line's field table (src/podsrl/config_fields.json,
which `podsrl train --help` prints without importing the config's modules) from
podsrl.trainer.config.Config, the single source of truth (tests/test_docs.py and tests/test_cli.py fail
when either and the config disagree).

    python scripts/config_table.py
"""

import dataclasses
import json
import re
from pathlib import Path

from podsrl.cli import FIELD_TABLE, field_rows
from podsrl.options import flat_names
from podsrl.rollout import ENGINES, EngineOptions, options_class
from podsrl.run_folder.eval_command import EVAL_FIELDS
from podsrl.trainer.config import FIELDS, Config

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
HEADER = """# Configuration

One frozen dataclass, `podsrl.trainer.config.Config`, is the single source of truth; this page is
generated from it by `python scripts/config_table.py`, one table per class that declares fields:
the config's own, then each job's options, declared in the module that reads them
([architecture.md](architecture.md#a-runs-life), "Adding a setting"). Values come from the defaults
below, then `--config FILE.yaml`, then `--field value` options (`podsrl train --help`
lists the same). Every value is validated before any work, with errors that name the
field (and the YAML file and line). A field that names a component (`downsampling_rule`,
`advantage_estimator`, `loss_type`, `generation_engine`, `generation_schedule`, `task`,
`reward_funcs`, `prompt_selector`, `generation_watchers`) also takes a mapping of its name and keyword arguments,
`{name: ..., argument: value}` ([algorithms.md](algorithms.md#components-with-arguments)).

```bash
podsrl train --config configs/tiny-lora.yaml --learning_rate 5e-4 --output_dir runs/from-yaml
```

"""


def render() -> str:
    """One table per class that declares fields, in config.json's order: the config's own
    fields, then each job's options (declared in the module that reads them)."""
    sections, seen = [], set()
    for owner in reversed(Config.__mro__):
        own = [f for f in dataclasses.fields(owner) if f.name not in seen] if dataclasses.is_dataclass(owner) else []
        if not own:
            continue
        seen |= {f.name for f in own}
        summary = (owner.__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        summary = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", re.sub(r" +", " ", summary))  # Sphinx roles as code
        rows = "\n".join(f"| `{f.name}` | `{f.default!r}` | {f.metadata['help']} |" for f in own)
        sections.append(f"## `{owner.__module__}.{owner.__name__}`\n\n{summary}\n\n"
                        f"| field | default | meaning |\n| --- | --- | --- |\n{rows}\n")
    assert seen == set(FIELDS), sorted(set(FIELDS) - seen)
    return HEADER + "\n".join(sections) + "\n" + engine_tables()


def engine_tables() -> str:
    """Each built-in engine's own options (its options class, in its module), set as the engine
    spec's arguments or by their flat config names (podsrl.options.flat_names)."""
    spelled = {option: name for name, option in flat_names(Config, EngineOptions).items()}
    sections = []
    for name, engine in ENGINES.items():
        kind = options_class(engine)
        own = [f for f in dataclasses.fields(kind) if f.name not in kind.run_fields]
        rows = "\n".join(f"| `{f.name}` | `{f.default!r}` | "
                         f"{'`' + spelled[f.name] + '`' if f.name in spelled else ''} | {f.metadata['help']} |"
                         for f in own)
        sections.append(f"### `{name}`: `{kind.__module__}.{kind.__name__}`\n\n| option | default | flat name | "
                        f"meaning |\n| --- | --- | --- | --- |\n{rows}\n")
    return (ENGINE_HEADER + "\n".join(sections))


ENGINE_HEADER = """## Engine options

Each engine's options are its own, declared in its module; set them as the engine spec's
arguments, `generation_engine: {name: slots, micro_group: 64}`, or by their flat names above
(a spec's argument wins). Sampling (`max_completion_length`, `temperature`, `top_p`) and what the
run knows (the policy's dtype, the seed, the processes) are the run's to set
([generation.md](generation.md)).

"""


if __name__ == "__main__":
    PAGE.write_text(render())
    FIELD_TABLE.write_text(json.dumps(field_rows(Config, EVAL_FIELDS), indent=1) + "\n", encoding="utf-8")
    print(f"{PAGE}, {FIELD_TABLE}: {len(FIELDS)} config fields")
