"""Components with arguments (podsrl.registry): a component field may be a mapping of the name
and keyword arguments, ``downsampling_rule: {name: my.py:rule, keep: highest}`` (JSON text on
the command line), bound at start-up after a check against the component's signature, for
every kind; string specs behave exactly as before."""

import itertools
import json
import random
import sys

import pytest
import torch

from podsrl import cli
from podsrl.algorithms.advantages import ADVANTAGES
from podsrl.algorithms.select import RULES, select
from podsrl.config_checks import COMPONENTS
from podsrl.experiments.compare import arm_dir_name
from podsrl.experiments.runs import arm_variants
from podsrl.registry import Bound, component_label, load_object
from podsrl.rewards import REWARDS, load_reward_fn
from podsrl.rewards.stack import runs_in_worker
from podsrl.rollout import SCHEDULES, Schedule
from podsrl.rollout.schedule import PendingSamples
from podsrl.run_folder.claim import RunDirError, check_resume_config
from podsrl.trainer.config import FIELDS, Config, make_config, parse_value

USER_CODE = '''
import zlib

import torch

from podsrl.algorithms.advantages import group_advantages
from podsrl.prompt_selection import ShuffledPass
from podsrl.rewards import bounded
from podsrl.rollout import Schedule, SlotsEngine
from podsrl.tasks import Task
from podsrl.tasks.arithmetic import build_arithmetic

SEEN = {}  # what each component was given, by kind (calls made in the trainer's process)


def ranked(rewards, m, generator=None, keep="lowest"):
    """The m lowest (or highest) rewards of each group, ties to the lower index."""
    SEEN["rule"] = keep
    order = rewards.argsort(dim=1, stable=True)  # [P, n]
    return (order[:, :m] if keep == "lowest" else order[:, -m:]).sort(dim=1).values


def late(rewards, m, temperature, generator=None):
    return rewards.argsort(dim=1)[:, :m].sort(dim=1).values


def scaled(rewards, scale_by_std=True, factor=1.0):
    SEEN["advantages"] = factor
    return group_advantages(rewards, scale_by_std) * factor


def summed(per_token, mask, num_sequences, num_tokens, scale=1.0):
    SEEN["loss"] = scale
    return scale * (per_token * mask).sum() / num_sequences


class Engine(SlotsEngine):
    def __init__(self, options, label="plain"):
        super().__init__(options)
        SEEN["engine"] = label


def nth_last(pending, candidates, back=0):
    SEEN["schedule"] = back
    return candidates[-1 - min(back, len(candidates) - 1)]


NTH_LAST = Schedule(nth_last)


def crc_parity(prompts, completions, **columns):
    return [float(zlib.crc32(c.encode()) % 2) for c in completions]


def build(options, with_train=True, num_train=100):
    SEEN["task"] = num_train
    task = build_arithmetic(level=3, num_train=num_train, num_test=options.eval_prompts, seed=options.data_seed)
    return Task(name="parity", train=task.train, test=task.test, correct_fn=crc_parity, format_fn=crc_parity,
                extract_fn=lambda completion: completion)


@bounded(0.0, 2.0)
def parity_bonus(prompts, completions, bonus=1.0, **columns):
    return [bonus * float(zlib.crc32(c.encode()) % 2) for c in completions]


class Offset(ShuffledPass):
    def __init__(self, size, options=None, offset=0):
        super().__init__(size) if options is None else super().__init__(size, options)
        SEEN["selector"] = offset
'''


@pytest.fixture
def user(tmp_path):
    """The file of user components above, and the spec of one of them by name."""
    path = tmp_path / "user_components.py"
    path.write_text(USER_CODE)
    return lambda name: f"{path}:{name}"


def seen(spec: str) -> dict:
    """The SEEN record of the user file ``spec`` names (loaded under a private module name)."""
    return sys.modules[load_object(spec, "test").__module__].SEEN


# every kind: (field, a user component of it, a keyword argument it takes, a value, the first argument podsrl passes)
KINDS = [("downsampling_rule", "ranked", "keep", "highest", "rewards"),
         ("advantage_estimator", "scaled", "factor", 2.0, "rewards"),
         ("loss_type", "summed", "scale", 0.5, "per_token"),
         ("generation_engine", "Engine", "label", "mine", "options"),
         ("generation_schedule", "NTH_LAST", "back", 1, "pending"),
         ("task", "build", "num_train", 50, "options"),
         ("reward_funcs", "parity_bonus", "bonus", 0.5, "completions"),
         ("prompt_selector", "Offset", "offset", 3, "size")]


# what a component takes besides its own keyword argument: the user's engine subclasses the slots
# engine, so it takes the slots engine's options too (podsrl.rollout.SlotsOptions)
TAKES_TOO = {"generation_engine": ["decode_path", "memory_mb", "micro_group", "probe_tokens", "refill", "schedule"]}


def takes(field: str, key: str) -> str:
    return ", ".join(sorted([key, *TAKES_TOO.get(field, [])]))


def bound_arguments(obj) -> dict:
    """The keyword arguments bound to a resolved component (a schedule's go to its pick)."""
    return (obj.pick if isinstance(obj, Schedule) else obj).keywords


@pytest.mark.parametrize("field, name, key, value, passed", KINDS, ids=[k[0] for k in KINDS])
def test_every_kind_binds_checked_keyword_arguments(user, field, name, key, value, passed):
    registry, spec = COMPONENTS[field], {"name": user(name), key: value}
    assert bound_arguments(registry.resolve(spec)) == {key: value}
    misspelled = {"name": user(name), key + "x": value}
    with pytest.raises(ValueError) as refused:
        registry.resolve(misspelled)
    assert str(refused.value) == (f"{field}: {user(name)} takes no argument {key + 'x'!r} (it takes: "
                                  f"{takes(field, key)})")
    with pytest.raises(ValueError, match=rf"^{field}: .*: argument {passed!r} gets what podsrl passes \(it is called "
                                         rf"as .*\); it cannot be set in the config$"):
        registry.resolve({"name": user(name), passed: value})
    assert make_config(overrides={field: json.dumps(spec)})  # the command line's JSON, through validation


def test_a_kwarg_changes_what_a_user_rule_keeps_against_its_definition(user):
    """select with {name, keep} keeps exactly the m lowest / highest rewards (brute force over
    reward rows); the default keeps the lowest, so keep: highest changes what is selected."""
    rows = list(itertools.islice(itertools.product([0.0, 0.5, 1.0], repeat=5), 0, 243, 7))
    rewards = torch.tensor(rows)  # [P, 5]
    for m in (1, 2, 4):
        for keep, expected_sign in (("lowest", 1), ("highest", -1)):
            cfg = make_config(overrides={"downsampling_rule": {"name": user("ranked"), "keep": keep}})
            kept = select(cfg.downsampling_rule, rewards, m)  # [P, m]
            for row, picked in zip(rewards.tolist(), kept.tolist()):
                ordered = sorted(range(5), key=lambda i: (expected_sign * row[i], i if keep == "lowest" else -i))
                assert sorted(picked) == sorted(ordered[:m])
    default = select(user("ranked"), rewards, 2)
    assert torch.equal(default, select({"name": user("ranked"), "keep": "lowest"}, rewards, 2))
    highest = select({"name": user("ranked"), "keep": "highest"}, rewards, 2)
    assert not torch.equal(default, highest) and seen(user("ranked"))["rule"] == "highest"


def test_a_kwarg_that_would_take_a_passed_argument_or_the_wrong_type_is_refused(user):
    with pytest.raises(ValueError, match=r"^downsampling_rule: .*:late: argument 'temperature' gets what podsrl "
                                         r"passes \(it is called as \(rewards, m, generator=None\)\)"):
        make_config(overrides={"downsampling_rule": {"name": user("late"), "temperature": 0.5}})
    with pytest.raises(ValueError, match=r"^advantage_estimator: group: argument eps: expected a number like its "
                                         r"default 0.0001, got '1e-6' \(YAML reads 1e-6 as text: write 1.0e-6\)$"):
        make_config(overrides={"advantage_estimator": {"name": "group", "eps": "1e-6"}})
    with pytest.raises(ValueError, match=r"^downsampling_rule: max_variance takes no argument 'm2' \(it takes: none\)"):
        RULES.resolve({"name": "max_variance", "m2": 1})
    for bad, message in (({"keep": "x"}, "a mapping needs 'name'"), ({"name": user("ranked"), "keep": float("nan")},
                                                                     "must be JSON data"),
                         ({"name": user("ranked"), "keep": ("a",)}, "must be JSON data")):
        with pytest.raises(ValueError, match=f"^downsampling_rule: .*{message}"):
            RULES.resolve(bad)


@pytest.mark.parametrize("field", sorted(COMPONENTS))
def test_string_specs_and_name_only_mappings_are_unchanged(field):
    """Every built-in name: resolved to the registered object itself (nothing bound), parsed
    as the same text; a mapping of only a name is that name; lists of names stay text."""
    registry = COMPONENTS[field]
    for name, obj in registry.items():
        assert registry.resolve(name) is obj and registry.resolve({"name": name}) is obj
        assert parse_value(field, name) == name and parse_value(field, {"name": name}) == name
        assert registry.checked(name) is registry.checked(name)  # resolved once
        assert registry.checked(name).fn is obj and registry.checked(name).spec == name
        assert registry.checked(registry.checked(name)) is registry.checked(name)  # bound at set-up, passed through
    assert "Spec" in FIELDS[field].type  # the annotation says a mapping is accepted too
    assert parse_value(field, None) == "" and parse_value(field, "a:b") == "a:b"
    assert Config().to_dict() == json.loads(json.dumps(Config().to_dict()))  # the defaults: text, as before


def test_reward_funcs_take_a_list_of_names_and_mappings(user):
    assert parse_value("reward_funcs", ["a", "b"]) == "a,b" == parse_value("reward_funcs", '["a", "b"]')
    assert parse_value("reward_funcs", "a, b") == "a, b"  # text as before (reward_specs strips it)
    mixed = ["arithmetic_format", {"bonus": 2.0, "name": user("parity_bonus")}]
    stored = parse_value("reward_funcs", mixed)
    assert stored == parse_value("reward_funcs", json.dumps(mixed)) == ["arithmetic_format", mixed[1]]
    cfg = make_config(overrides={"reward_funcs": mixed, "reward_weights": "1,0.5"})
    assert cfg.reward_specs == stored and cfg.reward_weight_values == [1.0, 0.5]
    fn = load_reward_fn(cfg.reward_specs[1])
    assert isinstance(fn, Bound) and fn.__name__ == "parity_bonus" and fn.reward_bounds == (0.0, 2.0)
    assert runs_in_worker(fn) and not runs_in_worker(load_reward_fn({"name": "arithmetic_format"}))
    assert fn(prompts=["p", "q"], completions=["x", "y"]) == [2.0 * v for v in fn.func(["p", "q"], ["x", "y"])]
    with pytest.raises(TypeError, match="bonus: given in the config and passed on the call too"):
        fn(prompts=["p"], completions=["x"], bonus=[1.0])  # a data column named like a bound argument
    with pytest.raises(ValueError, match=r"^reward_funcs: .*: argument 'completion_ids' gets what podsrl passes"):
        REWARDS.resolve({"name": user("parity_bonus"), "completion_ids": 1})
    with pytest.raises(ValueError, match="^downsampling_rule: expected one rule, got a list"):
        parse_value("downsampling_rule", [{"name": "a", "k": 1}])


def test_reward_funcs_take_a_comma_list_of_names_and_json_mappings_as_compares_rules_do(user, monkeypatch, capsys):
    """#57: 'arithmetic_correct,{"name": ...}' was split at every comma: 'file not found: {"name"...'."""
    mapping = {"name": user("parity_bonus"), "bonus": 2.0}
    text = f'arithmetic_format, {json.dumps(mapping)},arithmetic_correct'
    assert parse_value("reward_funcs", text) == ["arithmetic_format", mapping, "arithmetic_correct"]
    assert parse_value("reward_funcs", '{"name": "a", "s": "x,{y"}, b') == [{"name": "a", "s": "x,{y"}, "b"]
    cfg = make_config(overrides={"reward_funcs": text, "reward_weights": "1,0.5,1"})
    assert isinstance(load_reward_fn(cfg.reward_specs[1]), Bound)
    with pytest.raises(ValueError, match=r"^reward_funcs: key 'bonus' given twice in "):
        parse_value("reward_funcs", 'arithmetic_format,{"name": "a", "bonus": 1, "bonus": 2}')
    monkeypatch.setattr(cli, "train", lambda cfg: pytest.fail("training started"))
    assert cli.main(["train", "--reward_funcs", 'arithmetic_format,{"name": "a.py:f", "x": oops}']) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "podsrl train: error: reward_funcs: not valid JSON (Expecting value: line 1 column 25 (char 24)): "
        "'{\"name\": \"a.py:f\", \"x\": oops}'"]


def test_config_json_round_trips_and_a_resume_compares_the_arguments(user, tmp_path):
    """config.json (JSON) keeps a mapping spec as a mapping; the config read back and its
    command-line form are equal, so a resume with the same arguments passes and one with
    other arguments is refused naming the field."""
    rng = random.Random(0)
    for _ in range(5):
        spec = {"name": user("ranked"), "keep": rng.choice(["lowest", "highest"])}
        bonus = {"name": user("parity_bonus"), "bonus": rng.choice([0.5, 1, 2.25])}
        cfg = make_config(overrides={"downsampling_rule": dict(reversed(list(spec.items()))), "reward_funcs": [bonus],
                                     "advantage_estimator": {"name": "group", "eps": rng.random()}})
        (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2))
        saved = json.loads((tmp_path / "config.json").read_text())
        assert saved["downsampling_rule"] == spec and list(saved["downsampling_rule"]) == ["name", "keep"]
        assert Config(**saved) == cfg
        assert {name: parse_value(name, json.dumps(saved[name])) for name in ("downsampling_rule", "reward_funcs",
                "advantage_estimator")} == {n: getattr(cfg, n) for n in ("downsampling_rule", "reward_funcs",
                                                                         "advantage_estimator")}
        assert check_resume_config(tmp_path, cfg.to_dict()) == []
        other = {**cfg.to_dict(), "downsampling_rule": {**spec, "keep": "middle"}}
        with pytest.raises(RunDirError, match="resume: the config differs .* in downsampling_rule: run "):
            check_resume_config(tmp_path, other)


def test_yaml_mappings_load_and_their_errors_name_file_and_line(user, tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(f"seed: 1\ndownsampling_rule: {{name: {user('ranked')}, keep: highest}}\n"
                    f"advantage_estimator:\n  name: group\n  eps: 1.0e-6\n"
                    f"reward_funcs: [arithmetic_format, {{name: {user('parity_bonus')}, bonus: 2}}]\n")
    cfg = make_config(path)
    assert cfg.downsampling_rule == {"name": user("ranked"), "keep": "highest"}
    assert cfg.advantage_estimator == {"name": "group", "eps": 1e-6}
    assert cfg.reward_specs == ["arithmetic_format", {"name": user("parity_bonus"), "bonus": 2}]
    path.write_text(f"seed: 1\ndownsampling_rule: {{name: {user('ranked')}, kep: highest}}\n")
    with pytest.raises(ValueError) as refused:
        make_config(path)
    assert str(refused.value) == (f"{path} line 2: downsampling_rule: {user('ranked')} takes no argument 'kep' "
                                  f"(it takes: keep)")
    path.write_text("prompt_selector: {offset: 3}\n")
    with pytest.raises(ValueError, match=r"run.yaml line 1: prompt_selector: a mapping needs 'name'"):
        make_config(path)


def test_the_command_line_refuses_a_bad_argument_before_any_model_loads(user, monkeypatch, capsys):
    monkeypatch.setattr(cli, "train", lambda cfg: pytest.fail("training started"))
    spec = json.dumps({"name": user("Offset"), "ofset": 1})
    assert cli.main(["train", "--prompt_selector", spec]) == 2
    error = capsys.readouterr().err.strip()
    assert error == (f"podsrl train: error: prompt_selector: {user('Offset')} takes no argument 'ofset' "
                     f"(it takes: offset)")
    assert cli.main(["train", "--prompt_selector", "{name: x"]) == 2
    assert "prompt_selector: not valid JSON" in capsys.readouterr().err


def test_a_key_given_twice_in_a_components_json_is_refused_naming_it(user, monkeypatch, capsys):
    """Python's json keeps the last of two equal keys: which component was meant is unknown."""
    monkeypatch.setattr(cli, "train", lambda cfg: pytest.fail("training started"))
    assert cli.main(["train", "--downsampling_rule", '{"name": "random", "name": "max_variance"}']) == 2
    assert capsys.readouterr().err.strip() == (
        "podsrl train: error: downsampling_rule: key 'name' given twice in '{\"name\": \"random\", \"name\": "
        "\"max_variance\"}'; JSON keeps only the last: remove one")
    twice = json.dumps([{"name": user("parity_bonus"), "bonus": 1.0}])[:-2] + ', "bonus": 2.0}]'
    with pytest.raises(ValueError, match=r"^reward_funcs: key 'bonus' given twice in "):
        parse_value("reward_funcs", twice)
    assert parse_value("downsampling_rule", '{"name": "random", "nested": {"name": 1}}') == {
        "name": "random", "nested": {"name": 1}}  # the same key in two mappings is no repeat


def test_a_keyword_only_argument_is_bound_for_every_kind_and_a_wrong_name_still_refused(tmp_path):
    path = tmp_path / "keyword_only.py"
    path.write_text(USER_CODE.replace("keep=\"lowest\"", "*, keep=\"lowest\"").replace("factor=1.0", "*, factor=1.0")
                    .replace("scale=1.0", "*, scale=1.0").replace('label="plain"', '*, label="plain"')
                    .replace("back=0", "*, back=0").replace("num_train=100", "*, num_train=100")
                    .replace("bonus=1.0, **columns", "*, bonus=1.0, **columns").replace("offset=0", "*, offset=0"))
    for field, name, key, value, _ in KINDS:
        spec = f"{path}:{name}"
        assert bound_arguments(COMPONENTS[field].resolve({"name": spec, key: value})) == {key: value}
        refusal = rf"^{field}: .* takes no argument '{key}x' \(it takes: {takes(field, key)}\)$"
        with pytest.raises(ValueError, match=refusal):
            COMPONENTS[field].resolve({"name": spec, key + "x": value})
    rewards = torch.tensor([[0.0, 1.0, 0.5, 0.25]])
    assert select({"name": f"{path}:ranked", "keep": "highest"}, rewards, 2).tolist() == [[1, 2]]
    assert make_config(overrides={"downsampling_rule": json.dumps({"name": f"{path}:ranked", "keep": "highest"})})


KEYWORD_ONLY = {'keep="lowest"': "*, keep", "factor=1.0": "*, factor", "scale=1.0": "*, scale",
                'label="plain"': "*, label", "back=0": "*, back", "num_train=100": "*, num_train",
                "bonus=1.0, **columns": "*, bonus, **columns", "offset=0": "*, offset"}


def test_a_keyword_only_argument_without_a_default_is_accepted_bound_and_refused_unbound_naming_it(tmp_path):
    """#57: the signature was checked before the spec's arguments were bound, so a required
    keyword-only argument was refused even when the config set it."""
    source = USER_CODE
    for old, new in KEYWORD_ONLY.items():
        source = source.replace(old, new)
    path = tmp_path / "required.py"
    path.write_text(source)
    for field, name, key, value, _ in KINDS:
        spec = f"{path}:{name}"
        assert bound_arguments(COMPONENTS[field].resolve({"name": spec, key: value})) == {key: value}
        if COMPONENTS[field].arity is None:  # a schedule's pick is called by the engine; a reward's are columns
            continue
        with pytest.raises(ValueError) as refused:
            COMPONENTS[field].resolve(spec)
        assert str(refused.value) == (f"{field}: {spec}: keyword-only argument '{key}' has no default and no value "
                                      f"in the config: set it ({{\"name\": \"{spec}\", \"{key}\": ...}}) or "
                                      f"give it a default")
    rule = json.dumps({"name": f"{path}:ranked", "keep": "highest"})
    assert make_config(overrides={"downsampling_rule": rule, "prompt_selector": json.dumps(
        {"name": f"{path}:Offset", "offset": 1}), "reward_funcs": json.dumps([{"name": f"{path}:parity_bonus",
                                                                              "bonus": 0.5}])})
    rewards = torch.tensor([[0.0, 1.0, 0.5, 0.25]])
    assert select(json.loads(rule), rewards, 2).tolist() == [[1, 2]]


def test_a_built_in_components_argument_out_of_range_is_refused_at_set_up(monkeypatch, capsys):
    """group's eps is added to the group's std: eps -1 would flip every advantage's sign
    (and 0 divide by a std near 0); refused in one line naming the field and the argument."""
    monkeypatch.setattr(cli, "train", lambda cfg: pytest.fail("training started"))
    assert cli.main(["train", "--advantage_estimator", '{"name": "group", "eps": -1}']) == 2
    assert capsys.readouterr().err.strip() == ("podsrl train: error: advantage_estimator: group: argument eps = -1: "
                                               "must be > 0 (it is added to each group's reward std)")
    for bad in (0, 0.0, -1e-9):
        with pytest.raises(ValueError, match=r"^advantage_estimator: group: argument eps = .*: must be > 0"):
            ADVANTAGES.resolve({"name": "group", "eps": bad})
    assert ADVANTAGES.resolve({"name": "group", "eps": 1e-6}).keywords == {"eps": 1e-6}


def test_a_built_in_selector_takes_its_settings_as_keyword_arguments_over_the_flat_fields():
    """{name: pass_rate, half_life: 20} builds pass_rate with half_life 20 whatever
    pass_rate_half_life says; a setting it does not read, the run's own (seed), a wrong type or
    a value out of range is refused in one line naming the field and the argument."""
    from podsrl.prompt_selection import PROMPT_SELECTORS, PromptSelectionOptions

    options = PromptSelectionOptions(seed=1, prompts_per_step=4, half_life=50.0, exploration=0.1)
    built = PROMPT_SELECTORS.checked({"name": "pass_rate", "half_life": 20.0, "exploration": 0.5})(10, options)
    assert (built.options.half_life, built.options.exploration, built.options.prior_strength) == (20.0, 0.5, 2.0)
    assert built.options.seed == 1 and PROMPT_SELECTORS.checked("pass_rate")(10, options).options.half_life == 50.0
    cfg = make_config(overrides={"prompt_selector": json.dumps({"name": "pass_rate", "half_life": 20}),
                                 "pass_rate_half_life": "80"})
    assert component_label(cfg.prompt_selector) == "pass_rate(half_life=20)"
    refusals = {"shuffled": ("half_life", 2.0, r"shuffled takes no argument 'half_life' \(it takes: none\)"),
                "pass_rate": ("seed", 3, r"pass_rate takes no argument 'seed' \(it takes: exploration, half_life, "
                                          r"prior_strength\)")}
    for name, (key, value, message) in refusals.items():
        with pytest.raises(ValueError, match=rf"^prompt_selector: {message}$"):
            make_config(overrides={"prompt_selector": json.dumps({"name": name, key: value})})
    with pytest.raises(ValueError, match=r"^prompt_selector: pass_rate: argument exploration = 0: must be in \(0, 1\]"):
        PROMPT_SELECTORS.resolve({"name": "pass_rate", "exploration": 0})
    with pytest.raises(ValueError, match=r"^prompt_selector: pass_rate: argument half_life: expected a number"):
        PROMPT_SELECTORS.resolve({"name": "pass_rate", "half_life": "long"})


def test_a_user_component_declares_its_arguments_ranges_with_argument_ranges(tmp_path):
    path = tmp_path / "ranged.py"
    path.write_text("import torch\nfrom podsrl.registry import argument_ranges, positive, probability\n"
                    "@argument_ranges(temperature=positive, share=probability)\n"
                    "def soft(rewards, m, generator=None, temperature=1.0, share=0.5):\n"
                    "    return rewards.argsort(dim=1)[:, :m].sort(dim=1).values\n")
    assert RULES.resolve({"name": f"{path}:soft", "temperature": 0.5, "share": 1}).keywords == {
        "temperature": 0.5, "share": 1}
    with pytest.raises(ValueError, match=r"^downsampling_rule: .*:soft: argument temperature = 0: must be > 0$"):
        RULES.resolve({"name": f"{path}:soft", "temperature": 0})
    with pytest.raises(ValueError, match=r"^downsampling_rule: .*:soft: argument share = 1.5: must be in \[0, 1\]$"):
        RULES.resolve({"name": f"{path}:soft", "share": 1.5})


def test_labels_and_folder_names_show_the_arguments_stably(user):
    """The label is the name with the arguments sorted (whatever the mapping's order); a
    comparison arm with a mapping rule is one folder, and a selector shows by its object."""
    keys = ["keep", "alpha", "beta"]
    labels = set()
    for order in itertools.permutations(keys):
        spec = {"name": "my.py:rule", **{key: keys.index(key) for key in order}}
        labels.add(component_label(spec))
        folder = arm_dir_name({"method": "pods", "num_generations": 8, "num_kept": 2, "downsampling_rule": spec})
        assert "/" not in folder and ":" not in folder and folder.startswith("pods-n8-m2-my.py_rule")
    assert labels == {"my.py:rule(alpha=1, beta=2, keep=0)"} and component_label("max_variance") == "max_variance"
    assert arm_variants({"prompt_selector": {"name": user("Offset"), "offset": 3}}) == ["Offset(offset=3)"]
    assert arm_variants({"prompt_selector": f"{user('Offset')}"}) == ["Offset"]
    assert arm_variants({"generation_engine": {"name": "slots", "micro_group": 64}}) == ["slots"]  # as "slots"
    assert arm_variants({"group_early_stop": True, "prune_running": True, "prune_rule": "sure"}) == [
        "early-stop", "prune-sure"]


def test_a_bound_schedule_keeps_what_it_says_it_needs(user):
    schedule = SCHEDULES.resolve({"name": user("NTH_LAST"), "back": 1})
    pending = PendingSamples(3, 1, {"name": user("NTH_LAST"), "back": 1}, [0.0] * 3, None)
    assert [pending.pop() for _ in range(3)] == [(1, 0), (0, 0), (2, 0)]
    assert schedule.plans_lanes is False and schedule.stop_groups_refusal == ""
    with pytest.raises(ValueError, match="^generation_schedule: .* is not a Schedule"):
        SCHEDULES.resolve({"name": user("nth_last"), "back": 1})


def test_tensorboard_records_a_mapping_as_its_json_text(tmp_path):
    pytest.importorskip("tensorboard")
    from podsrl.tracking import Trackers

    trackers = Trackers(["tensorboard"], tmp_path, "run")
    trackers.start({"downsampling_rule": {"name": "my.py:rule", "keep": 1}, "reward_funcs": ["a", {"name": "b"}],
                    "seed": 0, "task": "arithmetic"}, first_step=0)  # TensorBoard's hparams refuse a dict
    trackers.finish()
    hparams = next(tmp_path.glob("tensorboard/*/hparams.yml")).read_text()
    assert """downsampling_rule: '{"keep": 1, "name": "my.py:rule"}'""" in hparams and "task: arithmetic" in hparams


def test_a_run_trains_with_every_kind_given_arguments_and_resumes(user, random_model_dir, tmp_path):
    """Through the trainer's own set-up: each component gets its arguments; config.json holds
    the mappings; a resume with the same config passes the check."""
    from podsrl.metrics import read_metrics
    from podsrl.trainer import train

    specs = {field: {"name": user(name), key: value} for field, name, key, value, _ in KINDS}
    specs["reward_funcs"] = [specs["reward_funcs"]]
    values = dict(model=random_model_dir, max_steps=2, prompts_per_step=2, num_generations=4, num_kept=2,
                  max_completion_length=4, eval_prompts=4, eval_samples=1, eval_steps=0, save_steps=1,
                  progress="false", output_dir=str(tmp_path / "run"), micro_batch_size=4)
    overrides = {**{k: str(v) for k, v in values.items()}, **{k: json.dumps(v) for k, v in specs.items()}}
    train(make_config(overrides=overrides))
    assert seen(user("ranked")) == {"rule": "highest", "advantages": 2.0, "loss": 0.5, "engine": "mine",
                                    "schedule": 1, "task": 50, "selector": 3}
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert {field: saved[field] for field in specs} == specs
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2] and all(r["loss"] is not None for r in records[1:])
    train(make_config(overrides={**overrides, "max_steps": "3", "resume": "true"}))
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")][-1] == 3
