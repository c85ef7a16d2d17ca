"""Each option of a job is declared once (``hvd_magics.option_table``): these fail when a front end
drifts from the declaration. HorovodRunner's and HorovodPool's keywords (names, order, defaults,
annotations), JobOptions' defaults, the magics' flags (as parsed), the estimator's params, and
every keyword and flag reaching its option's check, whose message names it."""
import dataclasses
import inspect
import re
import shlex

import pytest
from IPython.core.error import UsageError

from hvd_magics import HorovodPool, HorovodRunner
from hvd_magics.option_table import (MAYBE_TEXT, NUMBER, OPTIONS, POOL_OPTIONS, REQUIRED,
                                     RUNNER_OPTIONS, SWITCH, TEXT, TEXTS)
from hvd_magics.options import JobOptions
from hvd_magics.protocol import ENGINE_HOROVOD

#: A wrong value of every option that has a check (``timeline`` takes any path, ``mlflow`` is
#: checked when the run asks for MLflow): a new option needs one here.
WRONG = {"np": 0, "driver_log_verbosity": "loud", "start_timeout": 0, "env": "FOO",
         "timeline_mark_cycles": "yes", "elastic_timeout": -1, "reset_limit": -1, "timeout": 0,
         "stall_after": 0, "engine": "jax", "restarts": -1, "checkpoint_dir": "", "fresh": "no",
         "keep_steps": "yes", "ranks_per_task": 0, "idle_timeout": 0}
#: What a value typed on a magic's line becomes, by how the magic reads it.
TYPED = {NUMBER: ("2", 2), TEXT: ("x", "x"), MAYBE_TEXT: ("x", "x")}


def _keywords(constructor: type, own: tuple[str, ...] = ()) -> dict[str, inspect.Parameter]:
    """The keywords of ``constructor`` but ``self`` and its ``own`` (not job options)."""
    return {name: parameter for name, parameter in
            inspect.signature(constructor.__init__).parameters.items()
            if name not in ("self", *own)}


@pytest.mark.parametrize("constructor, options, own", [
    (HorovodRunner, RUNNER_OPTIONS, ("pool",)),
    (HorovodPool, POOL_OPTIONS, ()),
])
def test_the_runner_and_the_pool_take_the_declared_keywords_and_defaults(
        constructor, options, own):
    keywords = _keywords(constructor, own)
    assert sorted(keywords) == sorted(option.name for option in options)
    for option in options:
        default = inspect.Parameter.empty if option.default is REQUIRED else option.default
        assert (keywords[option.name].default, keywords[option.name].annotation) == (
            default, option.type), option.name


def test_the_runners_keywords_come_in_the_declared_order():
    """``HorovodRunner(2, "all")`` is sparkdl's: the positional order is part of the API."""
    assert list(_keywords(HorovodRunner, ("pool",))) == [o.name for o in RUNNER_OPTIONS]


def test_job_options_default_to_the_declared_values_checked():
    fields = {field.name: field for field in dataclasses.fields(JobOptions)}
    resolved = {"engine": ENGINE_HOROVOD}  # None: the warm pool's engine, else Horovod
    for option in RUNNER_OPTIONS:
        field = fields.get(option.name)
        if field is None:  # np is ranks and on_driver; driver_log_verbosity is verbosity
            continue
        default = (field.default if field.default_factory is dataclasses.MISSING
                   else field.default_factory())
        assert default == resolved.get(option.name, option.checked(option.unset)), option.name
    assert JobOptions.checked({"np": 2}) == JobOptions(ranks=2)
    with pytest.raises(TypeError, match="'start_timout' is not an option of a job"):
        JobOptions.checked({"np": 2, "start_timout": 30})


@pytest.mark.parametrize("magic, options", [("horovod", RUNNER_OPTIONS),
                                            ("hvd_pool", POOL_OPTIONS)])
def test_the_magics_flags_are_the_declared_ones_and_parse_as_declared(magic, options):
    from hvd_magics.notebook.job_arguments import job_keywords
    from hvd_magics.notebook.magic_line import parse_line
    from hvd_magics.notebook.magics import HorovodMagics

    function = getattr(HorovodMagics, magic)
    actions = {action.dest: action for action in function.parser._actions}
    flagged = [option for option in options if option.flags]
    # a runner's or pool's keyword the magic takes is a declared flag, not one of its own
    keywords = set(_keywords(HorovodRunner)) | set(_keywords(HorovodPool))
    assert set(actions) & keywords == {option.name for option in flagged}
    for option in flagged:
        assert tuple(actions[option.name].option_strings) == option.flags, option.name
    given = parse_line(function, "", magic)
    assert {option.name: getattr(given, option.name) for option in flagged} == {
        option.name: option.unset for option in flagged}
    assert set(job_keywords(given, pool=magic == "hvd_pool")) == {
        option.name for option in flagged} - {"np", "env"}
    for option in flagged:
        flag = option.flags[-1]
        if option.reads == SWITCH:
            lines = {flag: True}
        elif option.reads == TEXTS:
            lines = {f"{flag} A=1 {flag} B=2": ["A=1", "B=2"]}
        else:
            typed, value = TYPED[option.reads]
            lines = {f"{flag} {typed}": value, f"{option.name}={typed}": value}
            if option.reads == MAYBE_TEXT:
                lines[flag] = True
        for line, value in lines.items():
            assert getattr(parse_line(function, line, magic), option.name) == value, line


def test_the_estimators_params_default_as_declared():
    from hvd_magics.estimator.params import EstimatorParams

    params = EstimatorParams()
    declared = [option for option in OPTIONS if option.param is not None]
    assert {option.param for option in declared} >= {"np", "startTimeout", "restarts"}
    for option in declared:
        assert params.getOrDefault(option.param) == option.unset, option.param


def test_every_option_with_a_check_has_a_wrong_value_here():
    assert set(WRONG) == {option.name for option in OPTIONS} - {"timeline", "mlflow"}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_each_check_names_its_option_and_no_other_flag(name):
    option = next(option for option in OPTIONS if option.name == name)
    with pytest.raises(ValueError) as raised:
        option.checked(WRONG[option.name])
    message = str(raised.value)
    assert message.startswith(option.name), message
    assert set(re.findall(r"\((--[\w-]+)\)", message)) <= set(option.flags), message


@pytest.mark.parametrize("constructor, options", [(HorovodRunner, RUNNER_OPTIONS),
                                                  (HorovodPool, POOL_OPTIONS)])
def test_each_keyword_reaches_its_check(constructor, options):
    for option in options:
        if option.name in WRONG:
            with pytest.raises(ValueError, match="^" + re.escape(option.name)):
                constructor(**{"np": -2, option.name: WRONG[option.name]})


@pytest.mark.parametrize("magic, options", [("horovod", RUNNER_OPTIONS),
                                            ("hvd_pool", POOL_OPTIONS)])
def test_each_flag_reaches_its_check(ip, magic, options):
    from hvd_magics.job.session import SESSION

    for option in options:
        if option.name not in WRONG or option.reads not in (NUMBER, TEXT) or not option.flags:
            continue
        words = f"{option.flags[-1]} {shlex.quote(str(WRONG[option.name]))}"
        line = words if option.name == "np" else f"np=-2 {words}"
        name = "%%horovod" if magic == "horovod" else "%hvd_pool start"
        with pytest.raises(UsageError, match="^" + re.escape(f"{name}: {option.name}")):
            if magic == "horovod":
                ip.run_cell_magic(magic, line, "x = 1\n")
            else:
                ip.run_line_magic(magic, f"start {line}")
        assert SESSION.pool is None
