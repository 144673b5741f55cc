"""A pytest plugin (``-p tests.machine_report`` in pyproject's addopts, so every stage loads it,
``--noconftest`` ones too): the report names the machine and its CPU kind, in the header and,
since the suite runs with ``-q`` (no header), again below the summary. bfloat16's speed and
rounding differ between AVX2, AVX-512 BF16 and AMX CPUs, and CI runs on whichever kind the
submitter has, so a report says which one it ran on."""

from podsrl.provenance import machine_description


def pytest_report_header(config):
    return f"machine: {machine_description()}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    terminalreporter.write_line(f"machine: {machine_description()}")
